"""eas_sdk: a drop-in, faster client for PAI-EAS services.

Replace ``from eas_prediction import X`` with ``from eas_sdk import X``.
Names are imported lazily so that ``import eas_sdk`` stays cheap and optional
extras (pandas) are only needed when used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._core.constants import (
    ENDPOINT_TYPE_DEFAULT,
    ENDPOINT_TYPE_DIRECT,
    ENDPOINT_TYPE_GATEWAY,
    ENDPOINT_TYPE_VIPSERVER,
)
from .errors import PredictException

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "StringRequest": "eas_sdk.requests",
    "StringResponse": "eas_sdk.requests",
    "TFRequest": "eas_sdk.requests",
    "TFResponse": "eas_sdk.requests",
    "TorchRequest": "eas_sdk.requests",
    "TorchResponse": "eas_sdk.requests",
    "BladeRequest": "eas_sdk.requests",
    "BladeResponse": "eas_sdk.requests",
    "OnnxRequest": "eas_sdk.requests",
    "OnnxResponse": "eas_sdk.requests",
    "PredictClient": "eas_sdk.predict",
    "AsyncPredictClient": "eas_sdk.predict",
    "QueueClient": "eas_sdk.queue",
    "AsyncQueueClient": "eas_sdk.queue",
    "Watcher": "eas_sdk.queue",
    "DataFrame": "eas_sdk.queue",
    "InputQueue": "eas_sdk.cluster_serving",
    "OutputQueue": "eas_sdk.cluster_serving",
}

if TYPE_CHECKING:  # pragma: no cover
    from .predict import AsyncPredictClient, PredictClient
    from .queue import AsyncQueueClient, DataFrame, QueueClient, Watcher
    from .requests import (
        BladeRequest,
        BladeResponse,
        StringRequest,
        StringResponse,
        TFRequest,
        TFResponse,
        TorchRequest,
        TorchResponse,
    )


_LAZY_MODULES: dict[str, str] = {
    "OnnxDataHelper": "eas_sdk.onnx_data_helper",
    "OnnxData": "eas_sdk._proto.onnx_data_pb2",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        value = importlib.import_module(_LAZY_MODULES[name])
        globals()[name] = value
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'eas_sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_MODULES))


__all__ = [
    "ENDPOINT_TYPE_DEFAULT",
    "ENDPOINT_TYPE_DIRECT",
    "ENDPOINT_TYPE_GATEWAY",
    "ENDPOINT_TYPE_VIPSERVER",
    "AsyncPredictClient",
    "AsyncQueueClient",
    "BladeRequest",
    "BladeResponse",
    "DataFrame",
    "InputQueue",
    "OnnxData",
    "OnnxDataHelper",
    "OnnxRequest",
    "OnnxResponse",
    "OutputQueue",
    "PredictClient",
    "PredictException",
    "QueueClient",
    "StringRequest",
    "StringResponse",
    "TFRequest",
    "TFResponse",
    "TorchRequest",
    "TorchResponse",
    "Watcher",
]
