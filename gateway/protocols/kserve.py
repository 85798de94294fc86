"""KServe's REST protocols (V2, the Open Inference Protocol, and V1) over an onnx service.

Parsing, validation and answer building only (no I/O). An inference request becomes one
request in the onnx processor's JSON form (docs/processors.md), so a V1/V2 call runs on
the same workers, with the same dtype and shape checks, as an EAS call; the processor's
JSON reply becomes the V2 or V1 answer. Model metadata is what the service's processor
reported when its workers became ready (gateway.workers.metadata.ModelMetadata).

What is not supported, and answered 400 where a request asks for it: the binary tensor
data extension (``Inference-Header-Content-Length``), ``binary_data`` parameters, and
model versions other than the one served. Every error is ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.workers.metadata import ModelMetadata, TensorSpec

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


def v2_metadata(model_name: str, meta: ModelMetadata) -> bytes:
    return dumps(
        {
            "name": model_name,
            "versions": list(meta.versions),
            "platform": meta.platform,
            "inputs": [t.as_json() for t in meta.inputs],
            "outputs": [t.as_json() for t in meta.outputs],
        }
    )


def triton_config(
    model_name: str, meta: ModelMetadata, *, workers: int, max_batch_size: int, queue_delay_ms: float
) -> bytes:
    """The model's configuration in Triton's JSON form (``GET /v2/models/<m>/config``), derived
    from its metadata and the service's settings: with dynamic batching on, the first (batch)
    dimension leaves ``dims`` and ``max_batch_size`` says how many rows a batch takes."""
    batched = max_batch_size > 1

    def tensor(t: TensorSpec) -> dict[str, Any]:
        dims = list(t.shape[1:]) if batched and t.shape else list(t.shape)
        return {
            "name": t.name,
            "data_type": "TYPE_" + _TRITON_TYPES.get(t.datatype, t.datatype),
            "dims": dims,
        }

    doc: dict[str, Any] = {
        "name": model_name,
        "platform": meta.platform,
        "backend": "onnxruntime" if meta.platform == "onnxruntime_onnx" else "python",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": max_batch_size if batched else 0,
        "input": [tensor(t) for t in meta.inputs],
        "output": [tensor(t) for t in meta.outputs],
        "instance_group": [{"name": model_name, "kind": "KIND_CPU", "count": workers}],
    }
    if batched:
        doc["dynamic_batching"] = {"max_queue_delay_microseconds": round(queue_delay_ms * 1000)}
    return dumps(doc)


def triton_statistics(figures: list[tuple[str, Any]]) -> bytes:
    """Triton's statistics extension answer for (model name, InferStats) pairs. The gateway
    measures a call as a whole: ``compute_infer`` is the processor's own time, ``queue`` the
    rest of a successful call (waiting, transport); input and output are part of those."""

    def d(count: int, ns: int) -> dict[str, int]:
        return {"count": count, "ns": ns}

    stats = []
    for name, st in figures:
        n = st.success_count
        stats.append(
            {
                "name": name,
                "version": "1",
                "last_inference": st.last_inference_ms,
                "inference_count": n,
                "execution_count": n,
                "inference_stats": {
                    "success": d(n, st.success_ns),
                    "fail": d(st.fail_count, st.fail_ns),
                    "queue": d(n, max(0, st.success_ns - st.compute_ns)),
                    "compute_input": d(n, 0),
                    "compute_infer": d(n, st.compute_ns),
                    "compute_output": d(n, 0),
                    "cache_hit": d(0, 0),
                    "cache_miss": d(0, 0),
                },
                "batch_stats": [],
            }
        )
    return dumps({"model_stats": stats})


# Triton's model configuration names a V2 datatype TYPE_<name>, except BYTES (TYPE_STRING).
_TRITON_TYPES = {"BYTES": "STRING"}


# ----------------------------------------------------------------------------- V1


@dataclass(frozen=True)
class V1Request:
    size: int
    body: bytes  # the onnx processor's JSON request


def parse_v1_predict(body: bytes, sig: ModelMetadata) -> V1Request:
    """``{"instances": [...]}`` (row form): one instance per row; for a single-input model an
    instance is that input's row, otherwise an object naming every input. ``{"inputs": ...}``
    (column form, as TensorFlow Serving and KServe accept it): a list of rows for a
    single-input model, or an object naming every input with its list of rows."""
    doc = loads(body)
    if not isinstance(doc, dict):
        doc = {}
    key = "inputs" if "inputs" in doc and "instances" not in doc else "instances"
    if key == "inputs" and isinstance(doc["inputs"], dict):
        return _v1_columns(doc["inputs"], sig)
    instances = doc.get(key)
    if not isinstance(instances, list) or not instances:
        raise KServeRequestError('body must be a JSON object with a non-empty "instances" or "inputs" list')
    if len(instances) > MAX_INSTANCES:
        raise KServeRequestError(f'"{key}" has more than {MAX_INSTANCES} entries', 413)
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


def _v1_columns(inputs: dict[str, Any], sig: ModelMetadata) -> V1Request:
    """The column form naming every input: each value is that input's list of rows."""
    names = [t.name for t in sig.inputs]
    if set(inputs) != set(names):
        raise KServeRequestError(f'"inputs" names {sorted(inputs)}, the model has {names}')
    sizes = {len(v) if isinstance(v, list) else -1 for v in inputs.values()}
    if len(sizes) != 1 or min(sizes) < 1:
        raise KServeRequestError('every input in "inputs" must be a non-empty list of rows of one length')
    size = sizes.pop()
    if size > MAX_INSTANCES:
        raise KServeRequestError(f'"inputs" has more than {MAX_INSTANCES} rows', 413)
    return V1Request(size, dumps({"inputs": {n: inputs[n] for n in names}}))


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
    "V1Request",
    "V2Request",
    "error_body",
    "parse_v1_predict",
    "parse_v2_infer",
    "v1_predictions",
    "v2_metadata",
    "v2_response",
]
