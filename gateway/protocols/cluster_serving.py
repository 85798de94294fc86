"""The Cluster Serving REST protocol: ``{"instances": [...]}`` in, ``{"predictions": [...]}`` out.

Parsing and validation only (no I/O): a request body becomes one batched request in the
onnx processor's JSON form, and the processor's reply becomes one prediction per instance.

Mapping (see docs/async-inference.md):

* every instance must name the same inputs; each name is an ONNX model input;
* a number, a (nested) list of numbers or a string / list of strings is a dense tensor;
  the N instances are stacked on a new leading axis (the batch axis), so a model input
  ``ids`` of shape ``[batch, 2]`` takes ``{"ids": [100.0, 88.0]}`` per instance. Numbers
  keep their JSON kind: and are cast by the processor to the model input's dtype where that is safe;
  ``{"shape", "dtype", "data"}`` (no ``indices``) names the dtype explicitly;
* a string that is base64 of a JPEG/PNG/GIF/BMP/TIFF/WebP image, or ``{"b64": "..."}``,
  is decoded to a uint8 RGB array H x W x 3 (all images of a request must share a size);
* ``{"shape", "data", "indices"}`` is a sparse tensor (indices: one row per value) and
  becomes the inputs ``name.indices`` / ``name.values`` / ``name.shape`` of a batch-shaped
  sparse tensor ``[N, *shape]``;
* each prediction is an object ``{output name: value}`` holding that instance's slice of
  every output whose first dimension is the batch size (other outputs are repeated whole).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from eas_sdk._core.cluster_serving import (
    ClusterServingInputError,
    b64_image_bytes,
    batch_sparse,
    decode_image,
    outputs_from_reply,
    sparse_inputs,
    sparse_to_coo,
    tensor_to_wire,
    to_jsonable,
)

MAX_INSTANCES = 4096
_SPARSE_KEYS = {"shape", "data", "indices"}
_EXPLICIT_KEYS = {"shape", "dtype", "data"}


class ClusterServingRequestError(ValueError):
    """Bad input: answered with ``status`` and ``{"error": message}``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ClusterServingBatch:
    size: int
    body: bytes  # the onnx processor's JSON request


def _dense(value: Any, where: str) -> np.ndarray:
    if isinstance(value, bool):
        return np.asarray(value, dtype=np.bool_)
    if isinstance(value, str):
        raw = b64_image_bytes(value)
        if raw is not None:
            return decode_image(raw, where)
        return np.asarray(value, dtype=np.str_)
    try:
        arr = np.asarray(value)
    except ValueError:
        raise ClusterServingRequestError(f"{where}: nested lists must be rectangular") from None
    if arr.dtype == object:
        raise ClusterServingRequestError(f"{where}: nested lists must be rectangular and of one kind")
    if arr.size == 0 and arr.ndim >= 1:
        return arr.astype(np.float32)
    kind = arr.dtype.kind
    if kind == "f":
        return arr.astype(np.float64)
    if kind in "iu":
        return arr.astype(np.int64)
    if kind == "b":
        return arr
    if kind == "U":
        return arr
    raise ClusterServingRequestError(f"{where}: unsupported value")


def _explicit(value: dict[str, Any], where: str) -> np.ndarray:
    try:
        dtype = str(value.get("dtype", "float32"))
        shape = [int(d) for d in value["shape"]]
        data = value["data"]
        if dtype == "string":
            arr = np.asarray(data, dtype=np.str_)
        else:
            arr = np.asarray(data, dtype=np.dtype(dtype))
        return arr.reshape(shape)
    except (KeyError, TypeError, ValueError) as exc:
        raise ClusterServingRequestError(f"{where}: bad tensor ({exc})") from None


def _classify(value: Any, where: str) -> tuple[str, Any]:
    """-> ("sparse", coo) | ("dense", ndarray) | ("exact", ndarray with a stated dtype)."""
    if isinstance(value, dict):
        keys = set(value)
        if keys == _SPARSE_KEYS:
            try:
                coo = sparse_to_coo(value["indices"], value["data"], value["shape"], where, points_first=True)
            except ClusterServingInputError as exc:
                raise ClusterServingRequestError(str(exc)) from None
            return "sparse", coo
        if keys == {"b64"} and isinstance(value["b64"], str):
            import base64
            import binascii

            try:
                raw = base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, ValueError):
                raise ClusterServingRequestError(f"{where}: b64 is not valid base64") from None
            return "dense", decode_image(raw, where)
        if "path" in keys:
            raise ClusterServingRequestError(f"{where}: image paths are not accepted over HTTP; send b64")
        if keys <= _EXPLICIT_KEYS and {"shape", "data"} <= keys:
            return "exact", _explicit(value, where)
        raise ClusterServingRequestError(f"{where}: unknown object keys {sorted(keys)}")
    if value is None:
        raise ClusterServingRequestError(f"{where}: null is not a value")
    return "dense", _dense(value, where)


def parse_request(body: bytes) -> ClusterServingBatch:
    """A /predict body -> one batched onnx-processor request; raises ClusterServingRequestError."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ClusterServingRequestError(f"body is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("instances"), list):
        raise ClusterServingRequestError('body must be a JSON object with an "instances" list')
    instances = doc["instances"]
    if not instances:
        raise ClusterServingRequestError('"instances" is empty')
    if len(instances) > MAX_INSTANCES:
        raise ClusterServingRequestError(f'"instances" has more than {MAX_INSTANCES} entries', 413)
    names: list[str] | None = None
    parsed: list[dict[str, tuple[str, Any]]] = []
    for i, inst in enumerate(instances):
        if not isinstance(inst, dict) or not inst:
            raise ClusterServingRequestError(f"instances[{i}]: must be a non-empty object")
        if names is None:
            names = list(inst)
        elif set(inst) != set(names):
            raise ClusterServingRequestError(
                f"instances[{i}]: inputs {sorted(inst)} differ from instances[0] {sorted(names)}"
            )
        row: dict[str, tuple[str, Any]] = {}
        for name, value in inst.items():
            if not isinstance(name, str) or not name:
                raise ClusterServingRequestError(f"instances[{i}]: input names must be non-empty strings")
            try:
                row[name] = _classify(value, f"instances[{i}].{name}")
            except ClusterServingInputError as exc:
                raise ClusterServingRequestError(str(exc)) from None
        parsed.append(row)
    return batch_instances(parsed)


def batch_instances(instances: list[dict[str, tuple[str, Any]]]) -> ClusterServingBatch:
    """Instances of classified values (``"dense"``/``"exact"`` ndarray or ``"sparse"`` COO,
    per input name) -> one batched onnx-processor request; every instance must name the same
    inputs with the same shapes. Raises ClusterServingRequestError."""
    names = list(instances[0])
    columns: dict[str, list[tuple[str, Any]]] = {n: [] for n in names}
    for i, inst in enumerate(instances):
        if set(inst) != set(names):
            raise ClusterServingRequestError(
                f"instances[{i}]: inputs {sorted(inst)} differ from instances[0] {sorted(names)}"
            )
        for name in names:
            columns[name].append(inst[name])
    inputs: dict[str, Any] = {}
    for name, col in columns.items():
        kinds = {k for k, _ in col}
        if len(kinds) != 1:
            raise ClusterServingRequestError(f"{name}: mixes kinds of values across instances")
        if kinds == {"sparse"}:
            try:
                inputs.update(sparse_inputs(name, batch_sparse([v for _, v in col], name)))
            except ClusterServingInputError as exc:
                raise ClusterServingRequestError(str(exc)) from None
            continue
        arrays = [v for _, v in col]
        first = arrays[0]
        for j, arr in enumerate(arrays):
            if arr.shape != first.shape:
                raise ClusterServingRequestError(
                    f"instances[{j}].{name}: shape {list(arr.shape)} differs from {list(first.shape)}"
                )
        dtypes = {a.dtype.kind for a in arrays}
        if dtypes <= {"i", "u", "f"} and "f" in dtypes:
            arrays = [a.astype(np.float64) for a in arrays]
        elif len({a.dtype for a in arrays}) != 1 and not dtypes <= {"U"}:
            raise ClusterServingRequestError(f"{name}: values of different kinds across instances")
        inputs[name] = tensor_to_wire(np.stack(arrays), exact=kinds == {"exact"})
    return ClusterServingBatch(size=len(instances), body=json.dumps({"inputs": inputs}).encode())


def split_outputs(reply_body: bytes, size: int) -> list[dict[str, np.ndarray]]:
    """The processor's JSON reply -> one ``{output: ndarray}`` per instance: outputs whose
    first dimension is the batch size are sliced, the others repeated whole."""
    outputs = outputs_from_reply(json.loads(reply_body))
    out: list[dict[str, np.ndarray]] = [{} for _ in range(size)]
    for name, arr in outputs.items():
        split = arr.ndim >= 1 and arr.shape[0] == size
        for i in range(size):
            out[i][name] = np.asarray(arr[i]) if split else arr
    return out


def predictions_from_reply(reply_body: bytes, size: int) -> list[dict[str, Any]]:
    """The processor's JSON reply -> one ``{output name: value}`` per instance."""
    return [
        {name: to_jsonable(arr) for name, arr in inst.items()} for inst in split_outputs(reply_body, size)
    ]


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


__all__ = [
    "MAX_INSTANCES",
    "ClusterServingBatch",
    "ClusterServingRequestError",
    "batch_instances",
    "error_body",
    "parse_request",
    "predictions_from_reply",
    "split_outputs",
]
