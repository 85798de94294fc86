"""Python processor: user code in the shape of an EAS custom processor.

``entry`` is ``path/to/file.py:Class`` or ``package.module:Class``. The class is
instantiated without arguments, given ``config`` (the service's ``config`` mapping)
and ``model_path`` (the service's ``model`` or None), then ``initialize()`` is called
once. ``process(data: bytes)`` returns a body (bytes or str), a ``(body, status)`` pair or
a ``(body, status, content_type)`` triple; status 0 means 200 (allspark samples return 0
for success). A ``process`` with a ``headers`` parameter is also given the request's
headers (a dict; credentials and hop-by-hop headers are never among them). An exception in
``process`` is answered 400 with its message and the worker keeps serving; so is a
SystemExit, KeyboardInterrupt or other BaseException (it would otherwise end the worker's
compute thread), unless the interpreter itself is shutting down.

An optional ``metadata()`` method describes the model for clients that ask: a
``ModelMetadata`` or a mapping ``{"inputs": [...], "outputs": [...], "platform": ...}``
whose tensors are ``{"name", "datatype", "shape"}`` (V2 datatype names, -1 for any
size). It is called once, after ``initialize()``; what it returns is checked there, so a
malformed answer fails the worker's start with a clear message. Without it the metadata
is empty.
"""

from __future__ import annotations

import inspect
import logging
import sys
from typing import Any

from gateway.config.user_code import import_class
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.core.metadata import ModelMetadata
from gateway.worker.processors.base import LoadError, Processor, ProcessorError

log = logging.getLogger("gateway.worker")


def load_entry(entry: str) -> type:
    cls = import_class(entry)
    if not callable(getattr(cls, "process", None)):
        raise TypeError(f"entry {entry!r}: class {cls.__name__} has no process(data) method")
    return cls


class PythonProcessor(Processor):
    def load(self) -> None:
        cls = load_entry(self.service.entry or "")
        obj: Any = cls()
        obj.config = dict(self.service.config)
        obj.model_path = self.service.model
        if not callable(getattr(obj, "get_model_path", None)):
            obj.get_model_path = lambda: self.service.model
        init = getattr(obj, "initialize", None)
        if callable(init):
            try:
                init()
            except Exception as exc:
                detail = str(exc).splitlines()[0] if str(exc) else ""
                raise LoadError(f"initialize() raised {type(exc).__name__}: {detail}".rstrip(": ")) from exc
        self.obj = obj
        self._pass_headers = _takes_headers(obj.process)
        declared = getattr(obj, "metadata", None)
        self._metadata = ModelMetadata.from_json(declared()) if callable(declared) else ModelMetadata()

    def metadata(self) -> ModelMetadata:
        return self._metadata

    def handle(self, req: WorkerRequest) -> WorkerResponse:
        try:
            if self._pass_headers:
                result = self.obj.process(req.body, headers=req.headers)
            else:
                result = self.obj.process(req.body)
        except Exception as exc:
            log.info("processor raised %s (request %s)", type(exc).__name__, req.request_id)
            raise ProcessorError(str(exc) or type(exc).__name__, code="ProcessorError") from None
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit, ...
            if sys.is_finalizing():
                raise
            name = type(exc).__name__
            log.warning("processor raised %s (request %s)", name, req.request_id)
            detail = str(exc)
            msg = f"process() raised {name}: {detail}" if detail else f"process() raised {name}"
            raise ProcessorError(msg, code="ProcessorError") from None
        status = 200
        content_type: str | None = None
        if isinstance(result, tuple):
            if len(result) not in (2, 3):
                shapes = "body, (body, status) or (body, status, content_type)"
                raise ProcessorError(f"process() must return {shapes}", 500, "ProcessorError")
            result, status, *rest = result
            if rest:
                content_type = _content_type(rest[0])
            if isinstance(status, bool) or not isinstance(status, int):
                raise ProcessorError("process() returned a non-integer status", 500, "ProcessorError")
            if status == 0:
                status = 200
            if not 100 <= status <= 599:
                raise ProcessorError(f"process() returned status {status}", 500, "ProcessorError")
        if result is None:
            return WorkerResponse(status, b"", content_type or "application/octet-stream")
        if isinstance(result, str):
            return WorkerResponse(status, result.encode(), content_type or "text/plain; charset=utf-8")
        if isinstance(result, (bytes, bytearray, memoryview)):
            return WorkerResponse(status, bytes(result), content_type or "application/octet-stream")
        raise ProcessorError(
            f"process() returned {type(result).__name__}; expected bytes or str", 500, "ProcessorError"
        )

    def close(self) -> None:
        close = getattr(getattr(self, "obj", None), "close", None)
        if callable(close):
            close()


def _takes_headers(process: Any) -> bool:
    """Whether ``process`` accepts the request's headers: a ``headers`` parameter or ``**kwargs``."""
    try:
        params = inspect.signature(process).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "headers" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _content_type(value: Any) -> str:
    # One header value: printable ASCII, no line breaks (they would split the response head).
    if not isinstance(value, str) or not value or any(not 0x20 <= ord(c) < 0x7F for c in value):
        raise ProcessorError("process() returned an invalid content type", 500, "ProcessorError")
    return value
