"""The processor interface a worker process runs, and the factory for configured ones."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod

from gateway.config import ServiceConfig
from gateway.workers.ipc import WorkerRequest, WorkerResponse

JSON = "application/json"


class ProcessorError(Exception):
    """A request the processor refuses; answered with ``status`` and a JSON error body."""

    def __init__(self, message: str, status: int = 400, code: str = "InvalidInput") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


def error_response(status: int, code: str, message: str, request_id: str = "") -> WorkerResponse:
    """The gateway's error shape: {"code", "message", "request_id"}."""
    body = json.dumps({"code": code, "message": message, "request_id": request_id}).encode()
    return WorkerResponse(status, body, JSON)


class Processor(ABC):
    """Loaded once per worker process; ``handle`` runs on the worker's compute thread."""

    def __init__(self, service: ServiceConfig) -> None:
        self.service = service

    @abstractmethod
    def load(self) -> None:
        """Load the model or user code; an exception here means the worker never becomes ready."""

    @abstractmethod
    def handle(self, req: WorkerRequest) -> WorkerResponse:
        """Answer one request (blocking). May raise ProcessorError."""

    def cancel_running(self) -> None:  # noqa: B027 - optional hook
        """Called from the event loop thread when the request now running was cancelled
        (timeout or caller gone); a processor that can interrupt its work does so."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources at shutdown."""


def create_processor(service: ServiceConfig) -> Processor:
    if service.processor == "onnx":
        from gateway.workers.processors.onnx import OnnxProcessor

        return OnnxProcessor(service)
    if service.processor == "python":
        from gateway.workers.processors.python import PythonProcessor

        return PythonProcessor(service)
    raise ValueError(f"service {service.name!r}: processor {service.processor!r} does not run in a worker")
