"""An existing ``kserve.Model`` subclass, served unchanged where the kserve package is installed.

A ``python`` service whose entry class derives from ``kserve.Model`` is built as KServe's
model server builds it: ``cls(name, **config)`` (the service's name, and its ``config``
mapping as keyword arguments: ``predictor_host``, ``protocol``, ... for a transformer), then
``load()``. Each call runs KServe's own ``Model.__call__``: ``preprocess``, then ``predict``
(or ``explain``), then ``postprocess``, sync or async, with the JSON body as the payload and
the request's headers, so a transformer's default ``predict`` reaches its
``predictor_host`` exactly as under KServe. The answer is the model's own JSON. Such a
model answers KServe V1 (``:predict``, ``:explain``) and EAS calls; V2 tensors are for
classes that declare them (gateway.worker.processors.user_tensors).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
from typing import Any

from gateway.core.calls import EXPLAIN, WorkerResponse
from gateway.core.metadata import KSERVE_PLATFORM, ModelMetadata
from gateway.worker.processors.base import LoadError, ProcessorError


def _kserve() -> Any:
    """The kserve package when the user's module imported it, else None (never imported here)."""
    return sys.modules.get("kserve")


def is_kserve_model(cls: type) -> bool:
    kserve = _kserve()
    base = getattr(kserve, "Model", None) if kserve is not None else None
    return isinstance(base, type) and issubclass(cls, base)


class KServeModel:
    """One ``kserve.Model`` instance and the event loop its async methods run on (the worker's
    compute thread owns it)."""

    def __init__(self, cls: type, name: str, config: dict[str, Any]) -> None:
        self.loop = asyncio.new_event_loop()
        kserve = _kserve()
        try:
            self.model = cls(name, **config)
            self._await(self.model.load())
        except Exception as exc:
            self.loop.close()
            detail = str(exc).splitlines()[0] if str(exc) else ""
            raise LoadError(f"{cls.__name__}: {type(exc).__name__}: {detail}".rstrip(": ")) from exc
        verb = kserve.model.InferenceVerb  # the model's own package's
        self._verbs = {EXPLAIN: verb.EXPLAIN, "predict": verb.PREDICT}
        # An explain of its own (KServe's default asks a separate explainer host).
        self.explains = type(self.model).explain is not kserve.Model.explain

    def _await(self, value: Any) -> Any:
        return self.loop.run_until_complete(value) if inspect.isawaitable(value) else value

    def metadata(self) -> ModelMetadata:
        return ModelMetadata(platform=KSERVE_PLATFORM, explains=self.explains)

    def call(self, body: bytes, headers: dict[str, str], verb: str) -> WorkerResponse:
        if verb == EXPLAIN and not self.explains:
            raise ProcessorError("this kserve.Model has no explain of its own", 404, "NotFound")
        try:
            payload = json.loads(body) if body else {}
        except (ValueError, UnicodeDecodeError):
            raise ProcessorError('a kserve.Model takes a JSON body (V1: {"instances": [...]})') from None
        lowered = {k.lower(): v for k, v in headers.items()}
        try:
            result, _ = self._await(self.model(payload, headers=lowered, verb=self._verbs[verb]))
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            code = status if isinstance(status, int) and 400 <= status <= 599 else 400
            message = f"{type(exc).__name__}: {exc}".rstrip(": ")
            raise ProcessorError(message, code, "ProcessorError") from None
        if isinstance(result, (bytes, bytearray)):
            return WorkerResponse(200, bytes(result), "application/octet-stream")
        try:
            return WorkerResponse(200, json.dumps(result).encode(), "application/json")
        except (TypeError, ValueError) as exc:
            raise ProcessorError(f"the model's answer is not JSON ({exc})", 500, "ProcessorError") from None

    def close(self) -> None:
        self.loop.close()


__all__ = ["KServeModel", "is_kserve_model"]
