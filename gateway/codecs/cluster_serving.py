"""The Cluster Serving REST protocol: ``{"instances": [...]}`` in, ``{"predictions": [...]}`` out.

Parsing and validation only (no I/O): a request body becomes one batched request in the
onnx processor's JSON form, and the processor's reply becomes one prediction per instance.

Mapping (see docs/async-inference.md):

* every instance must name the same inputs; each name is an ONNX model input;
* a number, a (nested) list of numbers or a string / list of strings is a dense tensor;
  the N instances are stacked on a new leading axis (the batch axis), so a model input
  ``ids`` of shape ``[batch, 2]`` takes ``{"ids": [100.0, 88.0]}`` per instance. Numbers
  keep their JSON kind and are cast by the processor to the model input's dtype where that is safe;
  strings stay Python strings (never numpy's fixed-width unicode);
  ``{"shape", "dtype", "data"}`` (no ``indices``) names the dtype explicitly, one of a fixed
  list (``float32``, ``int64``, ``string``, ...); the value count must match the shape;
* a string that is base64 of a JPEG/PNG/GIF/BMP/TIFF/WebP image, or ``{"b64": "..."}``,
  is decoded to a uint8 RGB array H x W x 3 (all images of a request must share a size); the
  pixels every image header declares count against one budget per request, checked before
  the image is decoded (413 beyond);
* ``{"shape", "data", "indices"}`` is a sparse tensor (indices: one row per value) and
  becomes the inputs ``name.indices`` / ``name.values`` / ``name.shape`` of a batch-shaped
  sparse tensor ``[N, *shape]``;
* each prediction is an object ``{output name: value}`` holding that instance's slice of
  every output whose first dimension is the batch size (other outputs are repeated whole);
  the answer is written straight from the output arrays, and refused (413) before it is
  built when it would pass the response limit (gateway.core.json_answer).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

try:  # orjson is part of the gateway extra; the stdlib is the fallback
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only without the extra
    _orjson = None  # type: ignore[assignment]

from eas_sdk._core.cluster_serving import (
    ClusterServingInputError,
    ImageTooLarge,
    b64_image_bytes,
    batch_sparse,
    decode_image,
    sparse_inputs,
    sparse_to_coo,
    tensor_to_wire,
)
from eas_sdk.codecs.eas.json_form import nested_leaves
from gateway.core import json_answer
from gateway.core.metadata import ModelMetadata, misfit

MAX_INSTANCES = 4096
# Deeper nesting than any tensor has (numpy allows 64 dimensions): refused before recursion.
MAX_DIMS = 32
# Pixels of all images of one request (uint8 RGB: 3 bytes each once decoded).
DEFAULT_MAX_IMAGE_PIXELS = 2048 * 2048
# JSON values of one request (a Python object each while it is parsed).
DEFAULT_MAX_VALUES = 1_000_000
_SPARSE_KEYS = {"shape", "data", "indices"}
_EXPLICIT_KEYS = {"shape", "dtype", "data"}
# The dtypes an explicit tensor may name: a client names one of these, never a numpy type
# string (``"U100000000"`` would make numpy allocate 400 MB per element).
_EXPLICIT_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(name)
    for name in (
        "float16", "float32", "float64", "int8", "int16", "int32", "int64",
        "uint8", "uint16", "uint32", "uint64", "bool",
    )
}  # fmt: skip
_STRING = np.dtype(object)


class ClusterServingRequestError(ValueError):
    """Bad input: answered with ``status`` and ``{"error": message}``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ClusterServingBatch:
    size: int
    body: bytes  # the onnx processor's JSON request


class _Budget:
    """What one request may still decode: image pixels, counted before each image is decoded."""

    def __init__(self, max_image_pixels: int) -> None:
        self.pixels = max_image_pixels

    def image(self, raw: bytes, where: str) -> np.ndarray:
        try:
            arr = decode_image(raw, where, max_pixels=self.pixels)
        except ImageTooLarge as exc:
            raise ClusterServingRequestError(f"{exc} (all images of a request together)", 413) from None
        self.pixels -= arr.shape[0] * arr.shape[1]
        return arr


def _flatten(value: Any, where: str) -> tuple[list[int], list[Any]]:
    """A rectangular nested list -> (its shape, its leaves), without recursion (the codec's)."""
    try:
        return nested_leaves(value, MAX_DIMS)
    except ValueError as exc:
        raise ClusterServingRequestError(f"{where}: {exc}") from None


def _leaf_kind(leaves: list[Any], where: str) -> str:
    """ "b" (bools), "i" (ints), "f" (numbers with a float), "s" (strings); one kind only."""
    kinds = set(map(type, leaves))  # in C: millions of values cost milliseconds
    if kinds == {bool}:
        return "b"
    if kinds <= {int, float} and kinds:
        return "f" if float in kinds else "i"
    if kinds == {str}:
        return "s"
    if type(None) in kinds:
        raise ClusterServingRequestError(f"{where}: null is not a value")
    raise ClusterServingRequestError(f"{where}: nested lists must be rectangular and of one kind")


def _array(
    shape: list[int], leaves: list[Any], kind: str, dtype: np.dtype[Any] | None, where: str
) -> np.ndarray:
    """Leaves -> an array of ``shape``: strings as Python objects (numpy's fixed-width unicode
    would pad every element to the longest one), numbers in ``dtype`` or their JSON kind."""
    if dtype is not None and dtype != _STRING and kind == "s":
        raise ClusterServingRequestError(f"{where}: dtype {dtype.name} needs numbers")
    if kind == "s" or dtype == _STRING:
        if kind != "s" and leaves:
            raise ClusterServingRequestError(f"{where}: dtype string needs string values")
        arr = np.empty(len(leaves), dtype=object)
        arr[:] = leaves
        return arr.reshape(shape)
    if dtype is None:
        dtype = {"b": np.dtype(np.bool_), "i": np.dtype(np.int64), "f": np.dtype(np.float64)}[kind]
    try:
        return np.asarray(leaves, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError, TypeError):
        raise ClusterServingRequestError(f"{where}: values do not fit dtype {dtype.name}") from None


def _dense(value: Any, where: str, budget: _Budget) -> np.ndarray:
    if isinstance(value, str):
        raw = b64_image_bytes(value)
        if raw is not None:
            return budget.image(raw, where)
    shape, leaves = _flatten(value, where)
    if not leaves:
        return np.zeros(shape, dtype=np.float32)
    return _array(shape, leaves, _leaf_kind(leaves, where), None, where)


def _explicit(value: dict[str, Any], where: str) -> np.ndarray:
    """``{"shape", "dtype", "data"}``: the values in the stated dtype (an allow-list), their
    count checked against the shape before anything is built."""
    name = value.get("dtype", "float32")
    if name == "string":
        dtype = _STRING
    elif isinstance(name, str) and name in _EXPLICIT_DTYPES:
        dtype = _EXPLICIT_DTYPES[name]
    else:
        allowed = ", ".join([*_EXPLICIT_DTYPES, "string"])
        raise ClusterServingRequestError(f"{where}: dtype {str(name)[:32]!r} is not one of {allowed}")
    shape = value["shape"]
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise ClusterServingRequestError(f"{where}: shape must be a list of at most {MAX_DIMS} integers")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ClusterServingRequestError(f"{where}: shape must be non-negative integers")
    _, leaves = _flatten(value["data"], where)
    count = 1
    for d in shape:
        count *= d
        if count > len(leaves):
            break
    if count != len(leaves):
        raise ClusterServingRequestError(f"{where}: shape {shape} does not match {len(leaves)} values")
    kind = _leaf_kind(leaves, where) if leaves else "f"
    return _array(shape, leaves, kind, dtype, where)


def _classify(value: Any, where: str, budget: _Budget) -> tuple[str, Any]:
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
            try:
                raw = base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, ValueError):
                raise ClusterServingRequestError(f"{where}: b64 is not valid base64") from None
            return "dense", budget.image(raw, where)
        if "path" in keys:
            raise ClusterServingRequestError(f"{where}: image paths are not accepted over HTTP; send b64")
        if keys <= _EXPLICIT_KEYS and {"shape", "data"} <= keys:
            return "exact", _explicit(value, where)
        raise ClusterServingRequestError(f"{where}: unknown object keys {sorted(keys)[:16]}")
    if value is None:
        raise ClusterServingRequestError(f"{where}: null is not a value")
    return "dense", _dense(value, where, budget)


def _load(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: nesting deeper than the interpreter's stack (thousands of "[").
        raise ClusterServingRequestError(f"body is not valid JSON ({str(exc)[:200]})") from None


def parse_request(
    body: bytes,
    *,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    max_values: int = DEFAULT_MAX_VALUES,
    signature: ModelMetadata | None = None,
) -> ClusterServingBatch:
    """A /predict body -> one batched onnx-processor request; raises ClusterServingRequestError.
    ``max_image_pixels``: all images of the request together; ``max_values``: JSON values of
    the document, counted before it is parsed (413 beyond either); ``signature``: see
    :func:`batch_instances`."""
    # Each JSON value becomes a Python object of 30-80 bytes: counting the separators (in C)
    # bounds what parsing can take before it starts.
    if max_values and body.count(b",") >= max_values:
        raise ClusterServingRequestError(f"the body holds more than {max_values} JSON values", 413)
    doc = _load(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("instances"), list):
        raise ClusterServingRequestError('body must be a JSON object with an "instances" list')
    instances = doc["instances"]
    if not instances:
        raise ClusterServingRequestError('"instances" is empty')
    if len(instances) > MAX_INSTANCES:
        raise ClusterServingRequestError(f'"instances" has more than {MAX_INSTANCES} entries', 413)
    budget = _Budget(max_image_pixels)
    names: list[str] | None = None
    parsed: list[dict[str, tuple[str, Any]]] = []
    for i, inst in enumerate(instances):
        if not isinstance(inst, dict) or not inst:
            raise ClusterServingRequestError(f"instances[{i}]: must be a non-empty object")
        if names is None:
            names = list(inst)
        elif set(inst) != set(names):
            raise ClusterServingRequestError(
                f"instances[{i}]: inputs {sorted(inst)[:16]} differ from instances[0] {sorted(names)[:16]}"
            )
        row: dict[str, tuple[str, Any]] = {}
        for name, value in inst.items():
            if not name:
                raise ClusterServingRequestError(f"instances[{i}]: input names must be non-empty strings")
            try:
                row[name] = _classify(value, f"instances[{i}].{name[:64]}", budget)
            except ClusterServingInputError as exc:
                raise ClusterServingRequestError(str(exc)) from None
        parsed.append(row)
    return batch_instances(parsed, signature)


def batch_instances(
    instances: list[dict[str, tuple[str, Any]]], signature: ModelMetadata | None = None
) -> ClusterServingBatch:
    """Instances of classified values (``"dense"``/``"exact"`` ndarray or ``"sparse"`` COO,
    per input name) -> one batched onnx-processor request; every instance must name the same
    inputs with the same shapes. ``signature``: the model's, when its workers check calls
    against it: a dtype or shape they would refuse is refused here, with their message,
    before the request is built. Raises ClusterServingRequestError."""
    names = list(instances[0])
    columns: dict[str, list[tuple[str, Any]]] = {n: [] for n in names}
    for i, inst in enumerate(instances):
        if set(inst) != set(names):
            raise ClusterServingRequestError(
                f"instances[{i}]: inputs {sorted(inst)} differ from instances[0] {sorted(names)}"
            )
        for name in names:
            columns[name].append(inst[name])
    stacked = {name: _stack(name, col) for name, col in columns.items()}
    if signature is not None:
        _refuse_misfit(stacked, signature)
    inputs: dict[str, Any] = {}
    for name, (kind, value) in stacked.items():
        if kind == "sparse":
            try:
                inputs.update(sparse_inputs(name, value))
            except ClusterServingInputError as exc:
                raise ClusterServingRequestError(str(exc)) from None
        else:
            batched = value[0][np.newaxis] if len(value) == 1 else np.stack(value)  # one: a view
            inputs[name] = tensor_to_wire(batched, exact=kind == "exact")
    return ClusterServingBatch(size=len(instances), body=dumps({"inputs": inputs}))


# The dtype the onnx processor reads a JSON list with no stated dtype as, by numpy kind (an
# image's uint8 pixels travel as JSON integers).
_LOOSE_DTYPES = {
    "b": np.dtype(np.bool_), "i": np.dtype(np.int64), "u": np.dtype(np.int64), "f": np.dtype(np.float64)
}  # fmt: skip


def _refuse_misfit(stacked: Mapping[str, tuple[str, Any]], signature: ModelMetadata) -> None:
    """The workers' own 400 for a dtype or shape their signature refuses, given here: a large
    call they would refuse is never encoded, sent, nor parsed a second time."""
    described: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {}
    loose: set[str] = set()
    for name, (kind, arrays) in stacked.items():
        if kind == "sparse":  # several tensors by other names: the workers check them
            return
        dtype = arrays[0].dtype
        if kind == "dense" and dtype.kind in _LOOSE_DTYPES:  # sent as JSON numbers, no dtype
            dtype = _LOOSE_DTYPES[dtype.kind]
            loose.add(name)
        described[name] = (dtype, (len(arrays), *arrays[0].shape))
    message = misfit(signature, described, loose)
    if message is not None:
        raise ClusterServingRequestError(message)


def _stack(name: str, col: list[tuple[str, Any]]) -> tuple[str, Any]:
    """One input's values across the instances -> (kind, batched value): a COO for
    ``"sparse"``, else the instances' arrays, of one shape and dtype, to stack on the batch
    axis."""
    kinds = {k for k, _ in col}
    if len(kinds) != 1:
        raise ClusterServingRequestError(f"{name}: mixes kinds of values across instances")
    (kind,) = kinds
    if kind == "sparse":
        try:
            return kind, batch_sparse([v for _, v in col], name)
        except ClusterServingInputError as exc:
            raise ClusterServingRequestError(str(exc)) from None
    arrays = [v for _, v in col]
    first = arrays[0]
    for j, arr in enumerate(arrays):
        if arr.shape != first.shape:
            raise ClusterServingRequestError(
                f"instances[{j}].{name}: shape {list(arr.shape)} differs from {list(first.shape)}"
            )
    dtypes = {a.dtype.kind for a in arrays}
    if kind != "exact" and dtypes <= {"i", "u", "f"} and "f" in dtypes:
        # JSON numbers of one input: ints and floats across instances widen to float.
        arrays = [a.astype(np.float64) for a in arrays]
    elif len({a.dtype for a in arrays}) != 1:
        raise ClusterServingRequestError(f"{name}: values of different kinds across instances")
    return kind, arrays


def split_outputs(outputs: Mapping[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
    """The processor's outputs -> one ``{output: ndarray}`` per instance: outputs whose first
    dimension is the batch size are sliced (views, nothing copied), the others repeated whole."""
    out: list[dict[str, np.ndarray]] = [{} for _ in range(size)]
    for name, arr in outputs.items():
        split = arr.ndim >= 1 and arr.shape[0] == size
        for i in range(size):
            out[i][name] = arr[i : i + 1].reshape(arr.shape[1:]) if split else arr  # 1-D: a 0-d view
    return out


def predictions_answer(outputs: Mapping[str, np.ndarray], size: int, limit: int = 0) -> bytes | bytearray:
    """``{"predictions": [...]}``, one ``{output name: value}`` per instance, as JSON bytes
    written straight from the arrays; json_answer.AnswerTooLarge when it would pass ``limit``
    bytes (an output repeated whole counts once per instance)."""
    return json_answer.dumps({"predictions": split_outputs(outputs, size)}, limit)


def dumps(doc: Any) -> bytes:
    """JSON bytes; orjson (the gateway extra) when installed: 5-8 times faster on large
    tensors, and it holds the GIL (the event loop waits) for that much less."""
    if _orjson is not None:
        return _orjson.dumps(doc)
    return json.dumps(doc).encode()


__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "DEFAULT_MAX_VALUES",
    "MAX_INSTANCES",
    "ClusterServingBatch",
    "ClusterServingRequestError",
    "batch_instances",
    "dumps",
    "parse_request",
    "predictions_answer",
    "split_outputs",
]
