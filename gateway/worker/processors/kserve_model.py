"""An existing ``kserve.Model`` subclass, served unchanged where the kserve package is installed.

A ``python`` service whose entry class derives from ``kserve.Model`` is built as KServe's
model server builds it: ``cls(name, **config)`` (the service's name, and its ``config``
mapping as keyword arguments), then ``load()``. The ``config`` keys that are ModelServer's
flags for a transformer's predictor (``predictor_host``, ``predictor_protocol``, ...) set
KServe's predictor config, where KServe's default ``predict`` reads it (kserve.context).

Each call runs KServe's own ``Model.__call__``: ``preprocess``, then ``predict``
(or ``explain``), then ``postprocess``, sync or async, with the JSON body as the payload and
the request's headers, so a transformer's default ``predict`` reaches its
``predictor_host`` exactly as under KServe. The answer is the model's own JSON.

A V2 call (REST, JSON or binary, and gRPC ModelInfer) reaches it as KServe's V2 endpoints
hand one over: an ``InferRequest`` (kserve.protocol.infer_type) named after the model, each
input an ``InferInput`` with its name, datatype and shape, its ``data`` a flat list (text
for BYTES) and ``as_numpy()`` the array, the outputs asked for as ``request_outputs``, the
call's ``id`` and ``parameters`` as the client sent them (gRPC's as plain values, as REST's;
no ``id``, None, as under KServe). It answers an ``InferResponse`` or a V2 response dict;
its outputs go back by name, datatype and shape. An exception, V1 or V2, answers as KServe's
error handlers answer it: ``InvalidInput`` 400, ``ModelNotFound`` 404,
``NotImplementedError`` 501, an HTTP exception its own status, anything else 500 naming its
type. Its V2 metadata lists what ``get_input_types()`` and ``get_output_types()`` return,
as KServe's.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from eas_sdk.codecs import eas
from gateway.core.calls import EXPLAIN, INFER_ID_HEADER, INFER_PARAMETERS_HEADER, WorkerResponse
from gateway.core.metadata import KSERVE_PLATFORM, ModelMetadata
from gateway.worker.processors.base import LoadError, ProcessorError


def _kserve(module: str = "") -> Any:
    """The kserve package (or one of its modules, which it imports itself) when the user's
    module imported it, else None (never imported here)."""
    return sys.modules.get(f"kserve.{module}" if module else "kserve")


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
        # The model's calls run in a context of their own, holding the predictor's config
        # where ModelServer's flags would set it (kserve.context), so a transformer's default
        # predict reaches its predictor.
        self._ctx = contextvars.copy_context()
        kwargs, flags = _split_config(cls, config)
        try:
            if flags.get("predictor_host"):
                predictor = _kserve("predictor_config").PredictorConfig(**flags)
                self._ctx.run(_kserve("context").set_predictor_config, predictor)
            self.model = self._ctx.run(cls, name, **kwargs)
            self._await(self._ctx.run(self.model.load))
        except Exception as exc:
            self.loop.close()
            detail = str(exc).splitlines()[0] if str(exc) else ""
            raise LoadError(f"{cls.__name__}: {type(exc).__name__}: {detail}".rstrip(": ")) from exc
        verb = kserve.model.InferenceVerb  # the model's own package's
        self._verbs = {EXPLAIN: verb.EXPLAIN, "predict": verb.PREDICT}
        # An explain of its own (KServe's default asks a separate explainer host).
        self.explains = type(self.model).explain is not kserve.Model.explain
        try:  # what KServe's own V2 metadata lists for it
            types = {
                "inputs": self._await(self._ctx.run(self.model.get_input_types)),
                "outputs": self._await(self._ctx.run(self.model.get_output_types)),
            }
            self._metadata = ModelMetadata.from_json(
                {**types, "platform": KSERVE_PLATFORM, "explains": self.explains}
            )
        except Exception as exc:
            self.loop.close()
            raise LoadError(f"{cls.__name__}: get_input_types()/get_output_types(): {exc}") from exc

    def _await(self, value: Any) -> Any:
        if not inspect.isawaitable(value):
            return value
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._run_until_complete(value)
        # Loading may run where the worker's own loop is running: the model's loop runs in
        # a thread of its own meanwhile (it is never run by two threads at once).
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(self._run_until_complete, value).result()

    def _run_until_complete(self, value: Any) -> Any:
        return self.loop.run_until_complete(self.loop.create_task(_awaited(value), context=self._ctx))

    def metadata(self) -> ModelMetadata:
        return self._metadata

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
            raise _as_kserve_answers(_kserve("errors"), exc) from None
        if isinstance(result, (bytes, bytearray)):
            return WorkerResponse(200, bytes(result), "application/octet-stream")
        try:
            return WorkerResponse(200, json.dumps(result).encode(), "application/json")
        except (TypeError, ValueError) as exc:
            raise ProcessorError(f"the model's answer is not JSON ({exc})", 500, "ProcessorError") from None

    def call_tensors(self, body: bytes, headers: dict[str, str]) -> WorkerResponse:
        """A V2 call, in the gateway's TF form: run as KServe runs a V2 call (an InferRequest
        through ``preprocess``, ``predict``, ``postprocess``), answered in the TF form."""
        infer_type = _kserve("protocol.infer_type")
        try:
            decoded = eas.decode_request(body, "tf", "tf")
        except eas.InvalidInput as exc:
            raise ProcessorError(exc.message) from None
        lowered = {k.lower(): v for k, v in headers.items()}
        inputs = []
        try:
            for name, tensor in decoded.named.items():
                arr = tensor.array
                datatype = _datatype(arr)
                item = infer_type.InferInput(name, list(arr.shape), datatype, parameters={})
                # As KServe's REST endpoint does for binary tensors: the data as a flat list.
                item.set_data_from_numpy(arr, binary_data=False)
                inputs.append(item)
        except Exception as exc:  # an element KServe cannot carry (text that is not UTF-8)
            raise ProcessorError(f"{type(exc).__name__}: {exc}") from None
        asked = [infer_type.RequestedOutput(n) for n in decoded.output_names] or None
        # The call's own id and parameters, as KServe's endpoints hand them over (gRPC's
        # parameters as plain values, as REST's).
        call_id = lowered.get(INFER_ID_HEADER.lower())
        params = lowered.get(INFER_PARAMETERS_HEADER.lower())
        request = infer_type.InferRequest(
            self.model.name, inputs, request_id=call_id, request_outputs=asked,
            parameters=json.loads(params) if params else None,
        )  # fmt: skip
        try:
            result, _ = self._await(self.model(request, headers=lowered, verb=self._verbs["predict"]))
        except Exception as exc:
            raise _as_kserve_answers(_kserve("errors"), exc) from None
        outputs = _outputs_of(infer_type, result)
        missing = [n for n in decoded.output_names if n not in outputs]
        if missing:
            raise ProcessorError(f"the model's answer has no output {missing[0]!r}")
        names = list(decoded.output_names) or list(outputs)
        answer = eas.encode_tf_response([(n, outputs[n]) for n in names])
        return WorkerResponse(200, answer, eas.CONTENT_TYPE_PROTOBUF)

    def close(self) -> None:
        self.loop.close()


# ModelServer's own flags for a transformer's predictor (kserve.model_server), as the service's
# config names them -> PredictorConfig's arguments; ``protocol`` is the older spelling.
PREDICTOR_FLAGS = {
    "predictor_host": "predictor_host",
    "protocol": "predictor_protocol",
    "predictor_protocol": "predictor_protocol",
    "predictor_use_ssl": "predictor_use_ssl",
    "predictor_request_timeout_seconds": "predictor_request_timeout_seconds",
    "predictor_request_retries": "predictor_request_retries",
    "enable_predictor_health_check": "predictor_health_check",
}


def _split_config(cls: type, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the class's keyword arguments, PredictorConfig's): the predictor's flags go to the
    class too where its ``__init__`` names them (or takes ``**kwargs``), as older transformers'
    do."""
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())
    except (TypeError, ValueError):
        params = []
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    named = {p.name for p in params}
    kwargs = {k: v for k, v in config.items() if k not in PREDICTOR_FLAGS or takes_any or k in named}
    flags: dict[str, Any] = {}  # the older ``protocol`` first: predictor_protocol wins
    for key in sorted((k for k in config if k in PREDICTOR_FLAGS), key=lambda k: k != "protocol"):
        flags[PREDICTOR_FLAGS[key]] = config[key]
    return kwargs, flags


async def _awaited(value: Any) -> Any:
    return await value


def _datatype(arr: np.ndarray) -> str:
    if arr.dtype.kind == "O":
        return "BYTES"
    datatype = _kserve("utils.numpy_codec").from_np_dtype(arr.dtype)
    if not isinstance(datatype, str):
        raise ProcessorError(f"an input of dtype {arr.dtype} has no V2 datatype")
    return datatype


def _outputs_of(infer_type: Any, result: Any) -> dict[str, np.ndarray]:
    """The arrays of a V2 answer: an InferResponse, or a dict in V2's response shape (KServe
    validates it as an InferenceResponse)."""
    try:
        if isinstance(result, dict) and isinstance(result.get("outputs"), list):
            result = infer_type.InferResponse.from_rest(result)
        if not isinstance(result, infer_type.InferResponse):
            what = type(result).__name__
            raise TypeError(f"{what}; a V2 call needs an InferResponse or a V2 response dict")
        arrays: dict[str, np.ndarray] = {}
        for out in result.outputs:
            arr = np.asarray(out.as_numpy())
            if arr.dtype.kind == "O":  # text elements travel as bytes
                flat = np.empty(arr.size, dtype=object)
                flat[:] = [v if isinstance(v, bytes) else str(v).encode() for v in arr.reshape(-1).tolist()]
                arr = flat.reshape(arr.shape)
            arrays[out.name] = arr
        return arrays
    except Exception as exc:
        raise ProcessorError(
            f"InferenceError : the model's answer: {type(exc).__name__}: {exc}", 500, "ProcessorError"
        ) from None


def _as_kserve_answers(errors: Any, exc: Exception) -> ProcessorError:
    """The status and message KServe's model server answers ``exc`` with (kserve.errors)."""
    if isinstance(exc, errors.InvalidInput):
        return ProcessorError(str(exc), 400, "ProcessorError")
    if isinstance(exc, errors.ModelNotFound):
        return ProcessorError(str(exc), 404, "NotFound")
    if isinstance(exc, (NotImplementedError, errors.UnsupportedProtocol)):
        return ProcessorError(str(exc), 501, "ProcessorError")
    if isinstance(exc, errors.ModelNotReady):
        return ProcessorError(str(exc), 503, "ProcessorError")
    if isinstance(exc, errors.InferenceError):
        return ProcessorError(str(exc), 500, "ProcessorError")
    # An HTTP error of the web framework (FastAPI's HTTPException) answers with its status and
    # detail, as under KServe's server; anything else is a 500 naming its type.
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status <= 599:
        detail = getattr(exc, "detail", None)
        return ProcessorError(str(detail if detail is not None else exc), status, "ProcessorError")
    return ProcessorError(f"{type(exc).__name__} : {exc}", 500, "ProcessorError")


__all__ = ["KServeModel", "is_kserve_model"]
