"""KServe's REST protocols (V2, the Open Inference Protocol, and V1) over an onnx service.

Parsing, validation and answer building only (no I/O). An inference request becomes one
request in the onnx processor's JSON form (docs/processors.md), so a V1/V2 call runs on
the same workers, with the same dtype and shape checks, as an EAS call; the processor's
JSON reply becomes the V2 or V1 answer. Model metadata comes from the model file itself
(:func:`onnx_signature`, a small reader of the ONNX protobuf that needs neither the
``onnx`` package nor an ONNX Runtime session in the gateway process).

What is not supported, and answered 400 where a request asks for it: the binary tensor
data extension (``Inference-Header-Content-Length``), ``binary_data`` parameters, and
model versions other than the one served. Every error is ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import math
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eas_sdk.codecs.eas import CodecError
from eas_sdk.codecs.eas import fields as _fields

try:  # orjson is part of the gateway extra; the stdlib is the fallback
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None

# V2 datatype -> the onnx processor's JSON dtype name.
V2_TO_DTYPE: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "string",
}
DTYPE_TO_V2: dict[str, str] = {v: k for k, v in V2_TO_DTYPE.items()}
# ONNX TensorProto.DataType -> V2 datatype (BF16 is reported but cannot be sent as JSON).
ONNX_TO_V2: dict[int, str] = {
    1: "FP32",
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "BYTES",
    9: "BOOL",
    10: "FP16",
    11: "FP64",
    12: "UINT32",
    13: "UINT64",
    16: "BF16",
}
MAX_ELEMENTS = 1 << 28  # the processor's own cap per tensor, checked here before any copy
MAX_INPUTS = 1024
MAX_INSTANCES = 4096
MAX_NESTING = 32
JSON_TYPE = "application/json"
BINARY_HEADER = "Inference-Header-Content-Length"


class KServeRequestError(ValueError):
    """Bad input: answered with ``status`` and ``{"error": message}``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def loads(body: bytes) -> Any:
    try:
        return _orjson.loads(body) if _orjson is not None else json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise KServeRequestError(f"body is not valid JSON ({str(exc)[:120]})") from None


def dumps(doc: Any) -> bytes:
    if _orjson is not None:
        return _orjson.dumps(doc)
    return json.dumps(doc, separators=(",", ":")).encode()


def error_body(message: str) -> bytes:
    return dumps({"error": message})


# ----------------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class TensorMeta:
    name: str
    datatype: str  # V2 datatype ("FP32", ...), or "UNKNOWN" for non-tensor types
    shape: tuple[int, ...]  # -1 for a dynamic dimension

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class ModelSignature:
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]


def _tensor_type(buf: Any, a: int, b: int) -> tuple[str, tuple[int, ...]]:
    elem, dims = 0, []
    for f, wt, x, y in _fields(buf, a, b):
        if f == 1 and wt == 0:
            elem = x
        elif f == 2 and wt == 2:  # TensorShapeProto
            for df, dwt, dx, dy in _fields(buf, x, y):
                if df != 1 or dwt != 2:
                    continue
                value = -1
                for kf, kwt, kx, _ in _fields(buf, dx, dy):
                    if kf == 1 and kwt == 0:  # dim_value (int64)
                        value = kx if kx < 1 << 63 else -1
                dims.append(value)
    return ONNX_TO_V2.get(elem, "UNKNOWN"), tuple(dims)


def _value_info(buf: Any, a: int, b: int) -> TensorMeta:
    name, datatype, shape = "", "UNKNOWN", ()
    for f, wt, x, y in _fields(buf, a, b):
        if f == 1 and wt == 2:
            name = bytes(buf[x:y]).decode("utf-8", "replace")
        elif f == 2 and wt == 2:  # TypeProto
            for tf, twt, tx, ty in _fields(buf, x, y):
                if tf == 1 and twt == 2:  # tensor_type
                    datatype, shape = _tensor_type(buf, tx, ty)
    return TensorMeta(name, datatype, shape)


def _initializer_name(buf: Any, a: int, b: int) -> str:
    for f, wt, x, y in _fields(buf, a, b):
        if f == 8 and wt == 2:  # TensorProto.name
            return bytes(buf[x:y]).decode("utf-8", "replace")
    return ""


def signature_from_bytes(buf: Any) -> ModelSignature:
    """ModelProto bytes -> the graph's inputs (initializers excluded) and outputs."""
    inputs: list[TensorMeta] = []
    outputs: list[TensorMeta] = []
    initializers: set[str] = set()
    end = len(buf)
    for f, wt, a, b in _fields(buf, 0, end):
        if f != 7 or wt != 2:  # ModelProto.graph
            continue
        for gf, gwt, x, y in _fields(buf, a, b):
            if gwt != 2:
                continue
            if gf == 11:
                inputs.append(_value_info(buf, x, y))
            elif gf == 12:
                outputs.append(_value_info(buf, x, y))
            elif gf == 5:
                initializers.add(_initializer_name(buf, x, y))
    # Models of IR version < 4 list their initializers among the graph inputs too.
    return ModelSignature(tuple(i for i in inputs if i.name not in initializers), tuple(outputs))


def onnx_signature(path: str | Path) -> ModelSignature:
    """Read a model file's signature without loading its weights into memory (mmap)."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            return signature_from_bytes(view)
        except CodecError as exc:
            raise ValueError(f"{path}: not an ONNX model ({exc})") from None
        finally:
            view.release()


# ----------------------------------------------------------------------------- V2


@dataclass(frozen=True)
class V2Request:
    id: str | None
    body: bytes  # the onnx processor's JSON request
    outputs: tuple[str, ...]  # requested output names, in order (empty: all)


def _flatten(data: list[Any], where: str) -> list[Any]:
    """Row-major flattening of (possibly) nested lists; flat lists are returned as they are."""
    if not any(isinstance(v, list) for v in data):
        return data
    out: list[Any] = []

    def walk(v: list[Any], depth: int) -> None:
        if depth > MAX_NESTING:
            raise KServeRequestError(f"{where}: data nested more than {MAX_NESTING} deep")
        for item in v:
            if isinstance(item, list):
                walk(item, depth + 1)
            else:
                out.append(item)

    walk(data, 0)
    return out


def _shape(raw: Any, where: str) -> list[int]:
    if not isinstance(raw, list) or not all(type(d) is int and d >= 0 for d in raw):
        raise KServeRequestError(f"{where}: shape must be a list of non-negative integers")
    if math.prod(raw) > MAX_ELEMENTS:
        raise KServeRequestError(f"{where}: shape {raw} has more than {MAX_ELEMENTS} elements")
    return raw


def parse_v2_infer(body: bytes) -> V2Request:
    doc = loads(body)
    if not isinstance(doc, dict):
        raise KServeRequestError("body must be a JSON object")
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise KServeRequestError('"id" must be a string')
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise KServeRequestError('"inputs" must be a non-empty list')
    if len(raw_inputs) > MAX_INPUTS:
        raise KServeRequestError(f'"inputs" has more than {MAX_INPUTS} entries')
    inputs: dict[str, dict[str, Any]] = {}
    for i, t in enumerate(raw_inputs):
        where = f"inputs[{i}]"
        if not isinstance(t, dict):
            raise KServeRequestError(f"{where}: must be an object")
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise KServeRequestError(f"{where}: name must be a non-empty string")
        where = f"input '{name}'"
        if name in inputs:
            raise KServeRequestError(f"{where}: given twice")
        datatype = t.get("datatype")
        dtype = V2_TO_DTYPE.get(datatype) if isinstance(datatype, str) else None
        if dtype is None:
            raise KServeRequestError(
                f"{where}: datatype {str(datatype)[:32]!r} is not one of {', '.join(V2_TO_DTYPE)}"
            )
        shape = _shape(t.get("shape"), where)
        params = t.get("parameters")
        if isinstance(params, dict) and params.get("binary_data_size") is not None:
            raise KServeRequestError(f"{where}: the binary tensor data extension is not supported")
        data = t.get("data")
        if not isinstance(data, list):
            raise KServeRequestError(f"{where}: data must be a list")
        flat = _flatten(data, where)
        if len(flat) != math.prod(shape):
            raise KServeRequestError(
                f"{where}: shape {shape} needs {math.prod(shape)} values, got {len(flat)}"
            )
        inputs[name] = {"shape": shape, "dtype": dtype, "data": flat}
    wanted: list[str] = []
    raw_outputs = doc.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise KServeRequestError('"outputs" must be a list')
        for j, o in enumerate(raw_outputs):
            name = o.get("name") if isinstance(o, dict) else None
            if not isinstance(name, str) or not name:
                raise KServeRequestError(f"outputs[{j}]: name must be a non-empty string")
            params = o.get("parameters")
            if isinstance(params, dict) and params.get("binary_data"):
                raise KServeRequestError(
                    f"output '{name}': the binary tensor data extension is not supported"
                )
            wanted.append(name)
    return V2Request(rid, dumps({"inputs": inputs, "outputs": wanted}), tuple(wanted))


def _reply_outputs(reply: bytes) -> dict[str, Any]:
    doc = loads(reply)
    outputs = doc.get("outputs") if isinstance(doc, dict) else None
    if not isinstance(outputs, dict):
        raise ValueError("no outputs object")
    return outputs


def v2_response(model_name: str, req: V2Request, reply: bytes) -> bytes:
    """The processor's JSON reply -> a V2 inference response."""
    outputs = _reply_outputs(reply)
    names = req.outputs or tuple(outputs)
    out = []
    for name in names:
        t = outputs[name]
        out.append(
            {
                "name": name,
                "datatype": DTYPE_TO_V2.get(t["dtype"], str(t["dtype"]).upper()),
                "shape": t["shape"],
                "data": t["data"],
            }
        )
    doc: dict[str, Any] = {"model_name": model_name, "model_version": "1", "outputs": out}
    if req.id is not None:
        doc["id"] = req.id
    return dumps(doc)


def v2_metadata(model_name: str, sig: ModelSignature) -> bytes:
    return dumps(
        {
            "name": model_name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [t.as_json() for t in sig.inputs],
            "outputs": [t.as_json() for t in sig.outputs],
        }
    )


# ----------------------------------------------------------------------------- V1


@dataclass(frozen=True)
class V1Request:
    size: int
    body: bytes  # the onnx processor's JSON request


def parse_v1_predict(body: bytes, sig: ModelSignature) -> V1Request:
    """``{"instances": [...]}``: one instance per row. For a single-input model an
    instance is that input's row; otherwise an object naming every input."""
    doc = loads(body)
    instances = doc.get("instances") if isinstance(doc, dict) else None
    if not isinstance(instances, list) or not instances:
        raise KServeRequestError('body must be a JSON object with a non-empty "instances" list')
    if len(instances) > MAX_INSTANCES:
        raise KServeRequestError(f'"instances" has more than {MAX_INSTANCES} entries', 413)
    names = [t.name for t in sig.inputs]
    named = all(isinstance(inst, dict) for inst in instances)
    if not named:
        if len(names) != 1:
            raise KServeRequestError(
                f"the model has inputs {names}: each instance must be an object naming every input"
            )
        if any(isinstance(inst, dict) for inst in instances):
            raise KServeRequestError("instances must all be objects or all be values")
        return V1Request(len(instances), dumps({"inputs": {names[0]: instances}}))
    columns: dict[str, list[Any]] = {n: [] for n in names}
    for i, inst in enumerate(instances):
        if set(inst) != set(names):
            raise KServeRequestError(f"instances[{i}]: names inputs {sorted(inst)}, the model has {names}")
        for n in names:
            columns[n].append(inst[n])
    return V1Request(len(instances), dumps({"inputs": columns}))


def _nest(flat: list[Any], dims: list[int]) -> Any:
    if not dims:
        return flat[0]
    if len(dims) == 1:
        return list(flat)
    step = math.prod(dims[1:])
    return [_nest(flat[k * step : (k + 1) * step], dims[1:]) for k in range(dims[0])]


def v1_predictions(req: V1Request, reply: bytes) -> bytes:
    """One prediction per instance: the output's row for a single-output model, else
    ``{output: row}``. An output whose first dimension is not the batch is repeated whole."""
    outputs = _reply_outputs(reply)
    rows: dict[str, list[Any]] = {}
    for name, t in outputs.items():
        shape, data = list(t["shape"]), t["data"]
        if shape and shape[0] == req.size:
            step = math.prod(shape[1:])
            rows[name] = [_nest(data[k * step : (k + 1) * step], shape[1:]) for k in range(req.size)]
        else:
            whole = _nest(data, shape) if shape else data[0]
            rows[name] = [whole] * req.size
    if len(rows) == 1:
        (only,) = rows.values()
        preds: list[Any] = only
    else:
        preds = [{name: r[k] for name, r in rows.items()} for k in range(req.size)]
    return dumps({"predictions": preds})


__all__ = [
    "BINARY_HEADER",
    "JSON_TYPE",
    "KServeRequestError",
    "ModelSignature",
    "TensorMeta",
    "V1Request",
    "V2Request",
    "error_body",
    "onnx_signature",
    "parse_v1_predict",
    "parse_v2_infer",
    "signature_from_bytes",
    "v1_predictions",
    "v2_metadata",
    "v2_response",
]
