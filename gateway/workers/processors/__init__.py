"""Processors: what a worker runs for each request (onnx, python)."""

from gateway.workers.processors.base import Processor, ProcessorError, create_processor

__all__ = ["Processor", "ProcessorError", "create_processor"]
