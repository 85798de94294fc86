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

A class that declares its inputs (that ``metadata()``, or ``inputs``/``outputs`` class
attributes beside a ``predict`` method) is a model to the model protocols (KServe V1/V2,
Triton's clients): their calls arrive with ``X-Eas-Request-Format`` and reach
``predict(inputs)`` as numpy arrays by name, checked against the declaration
(gateway.worker.processors.user_tensors), and ``explain(inputs)`` when asked to explain
(``X-Eas-Verb: explain``). Every other call goes to ``process(data)`` as before; a class
without ``process`` takes EAS TF and JSON bodies on the tensor path too. A class with only
``process`` gets such calls in the JSON form (docs/processors.md), a TF-form one converted.
"""

from __future__ import annotations

import inspect
import logging
import sys
from dataclasses import replace
from typing import Any

from eas_sdk.codecs import eas
from gateway.config.user_code import import_class
from gateway.core import json_answer
from gateway.core.calls import EXPLAIN, RESPONSE_FORMAT_HEADER, VERB_HEADER, WorkerRequest, WorkerResponse
from gateway.core.metadata import ModelMetadata
from gateway.worker.processors import user_tensors
from gateway.worker.processors.base import LoadError, Processor, ProcessorError
from gateway.worker.processors.kserve_model import KServeModel, is_kserve_model

log = logging.getLogger("gateway.worker")


def load_entry(entry: str) -> type:
    cls = import_class(entry)
    if not callable(getattr(cls, "process", None)) and not callable(getattr(cls, "predict", None)):
        raise TypeError(
            f"entry {entry!r}: class {cls.__name__} has no process(data) or predict(inputs) method"
        )
    return cls


class PythonProcessor(Processor):
    _kserve: KServeModel | None = None

    def load(self) -> None:
        cls = load_entry(self.service.entry or "")
        if is_kserve_model(cls):  # served as KServe's model server serves it
            self._kserve = KServeModel(cls, self.service.name, dict(self.service.config))
            self._metadata = self._kserve.metadata()
            return
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
        process, predict, explain = (_method(obj, n) for n in ("process", "predict", "explain"))
        self._process = process
        self._pass_headers = process is not None and _takes_headers(process)
        meta = user_tensors.declared(obj, predict is not None, self.service)
        if predict is None and explain is not None:
            explain = None  # explain has predict's contract: a class without predict has neither
        if explain is not None and not meta.tensors:
            raise LoadError(
                "explain(inputs) needs the inputs declared (metadata(), or inputs/outputs attributes)"
            )
        if predict is not None and process is None and not meta.tensors:
            raise LoadError(
                "predict(inputs) needs the inputs declared (metadata(), or inputs/outputs attributes)"
            )
        self._metadata = replace(meta, explains=explain is not None)
        self._binding = user_tensors.Binding.of(meta) if meta.tensors else None
        self._tensor_methods = {"predict": predict, EXPLAIN: explain}
        self._tensor_headers = {
            k: m is not None and _takes_headers(m) for k, m in self._tensor_methods.items()
        }

    def metadata(self) -> ModelMetadata:
        return self._metadata

    def handle(self, req: WorkerRequest) -> WorkerResponse:
        if self._kserve is not None:
            if req.header("X-Eas-Request-Format"):  # a V2 call's tensors (REST or gRPC)
                return self._kserve.call_tensors(req.body, req.headers)
            verb = EXPLAIN if req.header(VERB_HEADER) == EXPLAIN else "predict"
            return self._kserve.call(req.body, req.headers, verb)
        if self._binding is not None:
            form = req.header("X-Eas-Request-Format")
            verb = req.header(VERB_HEADER)
            if self._tensor_methods["predict"] is not None and (form or verb or self._process is None):
                return self._tensor_call(req, form, EXPLAIN if verb == EXPLAIN else "predict")
            if form == "tf":  # a model protocol's tensors, for code that reads the JSON form
                return self._via_json_form(req)
        return self._process_call(req)

    def _process_call(self, req: WorkerRequest) -> WorkerResponse:
        if self._process is None:
            raise ProcessorError("this processor takes tensors only (predict(inputs))")
        try:
            if self._pass_headers:
                result = self._process(req.body, headers=req.headers)
            else:
                result = self._process(req.body)
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

    def _tensor_call(self, req: WorkerRequest, form: str | None, method: str) -> WorkerResponse:
        """A call with tensors: decoded (the form the header names, else the service's or
        sniffed), checked against the declaration, run by ``predict`` or ``explain``, and
        answered in the call's form (TF when the gateway asks for it)."""
        binding = self._binding
        assert binding is not None
        fn = self._tensor_methods[method]
        if fn is None:
            raise ProcessorError(f"this model has no {method}(inputs) method", 404, "NotFound")
        try:
            decoded = eas.decode_request(req.body, self.service.request_format, form)
        except eas.InvalidInput as exc:
            raise ProcessorError(exc.message) from None
        feeds = binding.bind(decoded)
        declared = [t.name for t in binding.outputs]
        if declared and method != EXPLAIN:
            indices = user_tensors.select(decoded, declared)  # an unknown output: 400 before the run
        if decoded.kind == "json" and req.header(RESPONSE_FORMAT_HEADER) == "tf":
            decoded = replace(decoded, kind="tf")
        try:
            result = fn(feeds, headers=req.headers) if self._tensor_headers[method] else fn(feeds)
        except Exception as exc:
            log.info("%s() raised %s (request %s)", method, type(exc).__name__, req.request_id)
            raise ProcessorError(
                f"{method}() raised {type(exc).__name__}: {exc}".rstrip(": "), code="ProcessorError"
            ) from None
        outputs = binding.outputs_of(result, method, every=method != EXPLAIN)
        if declared and method != EXPLAIN:
            names = declared
        else:  # an explanation may name tensors of its own, selected once they are known
            names = [*(n for n in declared if n in outputs), *(n for n in outputs if n not in declared)]
            indices = user_tensors.select(decoded, names)
        try:
            body, ctype = eas.encode_response(decoded, names, [outputs[n] for n in names], indices)
        except eas.InvalidInput as exc:
            raise ProcessorError(f"{method}(): {exc.message}", 500, "ProcessorError") from None
        return WorkerResponse(200, body, ctype)

    def _via_json_form(self, req: WorkerRequest) -> WorkerResponse:
        """A TF-form call for code that reads the JSON form: converted both ways."""
        try:
            decoded = eas.decode_request(req.body, "tf", "tf")
        except eas.InvalidInput as exc:
            raise ProcessorError(exc.message) from None
        inputs = [(n, t.array) for n, t in decoded.named.items()]
        doc = eas.encode_json_response(inputs).replace(b'{"outputs":', b'{"inputs":', 1)
        wanted = json_answer.dumps(list(decoded.output_names))
        body = bytes(doc[:-1]) + b',"outputs":' + bytes(wanted) + b"}"
        headers = {**req.headers, "X-Eas-Request-Format": "json", "Content-Type": "application/json"}
        resp = self._process_call(replace(req, body=body, headers=headers, content_type="application/json"))
        if resp.status != 200 or resp.body[:64].lstrip()[:1] != b"{":
            return resp
        try:
            arrays = json_answer.processor_outputs(resp.body)
            answer = eas.encode_tf_response(list(arrays.items()))
        except (ValueError, TypeError, KeyError) as exc:
            raise ProcessorError(
                f"process() answered no JSON-form outputs ({exc})", 500, "ProcessorError"
            ) from None
        return WorkerResponse(200, answer, eas.CONTENT_TYPE_PROTOBUF)

    def close(self) -> None:
        if self._kserve is not None:
            self._kserve.close()
            return
        close = getattr(getattr(self, "obj", None), "close", None)
        if callable(close):
            close()


def _method(obj: Any, name: str) -> Any:
    fn = getattr(obj, name, None)
    return fn if callable(fn) else None


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
