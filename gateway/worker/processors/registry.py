"""The processor a service runs, by its ``processor`` setting."""

from __future__ import annotations

from gateway.config import ServiceConfig
from gateway.worker.processors.base import Processor


def create_processor(service: ServiceConfig) -> Processor:
    # Imported on use: a worker loads only its own runtime's library (a python service's
    # needs neither numpy nor ONNX Runtime).
    if service.processor == "onnx":
        from gateway.worker.processors.onnx import OnnxProcessor

        return OnnxProcessor(service)
    if service.processor == "sklearn":
        from gateway.worker.processors.sklearn import SklearnProcessor

        return SklearnProcessor(service)
    if service.processor == "xgboost":
        from gateway.worker.processors.xgboost import XGBoostProcessor

        return XGBoostProcessor(service)
    if service.processor == "lightgbm":
        from gateway.worker.processors.lightgbm import LightGBMProcessor

        return LightGBMProcessor(service)
    if service.processor == "torch":
        from gateway.worker.processors.torch import TorchProcessor

        return TorchProcessor(service)
    if service.processor == "tensorflow":
        from gateway.worker.processors.tensorflow import TensorFlowProcessor

        return TensorFlowProcessor(service)
    if service.processor == "pmml":
        from gateway.worker.processors.pmml import PmmlProcessor

        return PmmlProcessor(service)
    if service.processor == "python":
        from gateway.worker.processors.python import PythonProcessor

        return PythonProcessor(service)
    if service.processor == "op":  # a pipeline step's op on worker processes of its own
        from gateway.worker.processors.op import OpProcessor

        return OpProcessor(service)
    raise ValueError(f"service {service.name!r}: processor {service.processor!r} does not run in a worker")


__all__ = ["create_processor"]
