"""The JSON predict form: ``{"inputs": {name: nested list | {"shape", "dtype", "data"}},
"outputs": [names]}`` in, ``{"outputs": {name: {"dtype", "shape", "data"}}}`` out.

JSON has no NaN or Infinity: such values are answered as null.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from itertools import chain
from typing import Any

import numpy as np

from .decoded import MAX_INPUTS, DecodedRequest, InputTensor, InvalidInput, count_elements, dtype_name

try:  # orjson is part of the gateway extra; the stdlib is the fallback
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only without the extra
    _orjson = None

_JSON_DTYPES = {
    "float32": np.float32, "float": np.float32, "float64": np.float64, "double": np.float64,
    "float16": np.float16, "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
    "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
    "bool": np.bool_, "string": object, "str": object, "bytes": object,
}  # fmt: skip


# Deeper nesting than any tensor has (numpy allows 64 dimensions).
MAX_NESTED_DIMS = 32


def nested_leaves(value: Any, max_dims: int = MAX_NESTED_DIMS) -> tuple[list[int], list[Any]]:
    """A rectangular nested list -> (its shape, its leaves in order); ValueError when it is
    ragged or deeper than ``max_dims``. Level by level: nothing recurses, and nothing is
    allocated beyond references to the parsed values (``np.asarray`` on strings would pad
    every element to the longest one: one long string among many short ones takes gigabytes)."""
    # map/set/chain run in C: a few passes over millions of values cost milliseconds.
    shape: list[int] = []
    level = [value]
    while level and isinstance(level[0], list):
        if set(map(type, level)) != {list} or len(set(map(len, level))) != 1:
            raise ValueError("nested lists must be rectangular")
        shape.append(len(level[0]))
        if len(shape) > max_dims:
            raise ValueError(f"more than {max_dims} dimensions")
        level = list(chain.from_iterable(level))
    if list in set(map(type, level)):
        raise ValueError("nested lists must be rectangular")
    return shape, level


def _loose_array(value: Any, where: str) -> np.ndarray:
    """A nested list (or scalar) with no stated dtype: strings as objects, numbers as numpy infers."""
    try:
        shape, leaves = nested_leaves(value)
    except ValueError as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    kinds = set(map(type, leaves))
    if kinds == {str}:
        arr = np.empty(len(leaves), dtype=object)
        arr[:] = [x.encode() for x in leaves]
        return arr.reshape(shape)
    if not kinds <= {int, float, bool}:
        raise InvalidInput(f"{where}: nested lists must be rectangular and of one type")
    if not leaves:
        return np.asarray(value)
    return np.asarray(leaves).reshape(shape)


def _json_loads(body: bytes) -> Any:
    try:
        if _orjson is not None:
            return _orjson.loads(body)
        return json.loads(body)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise InvalidInput("cannot decode request as json") from None


def _json_tensor(name: str, value: Any) -> InputTensor:
    where = f"input {name!r}"
    try:
        if isinstance(value, dict):
            data = value.get("data")
            if not isinstance(data, list):
                raise InvalidInput(f"{where}: 'data' must be a flat list")
            dtype_s = value.get("dtype")
            dt: Any = None
            if dtype_s is not None:
                if not isinstance(dtype_s, str) or dtype_s.lower() not in _JSON_DTYPES:
                    raise InvalidInput(f"{where}: unknown dtype {str(dtype_s)[:32]!r}")
                dt = _JSON_DTYPES[dtype_s.lower()]
            shape = value.get("shape")
            if shape is None:
                shape = [len(data)]
            if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in shape
            ):
                raise InvalidInput(f"{where}: 'shape' must be a list of integers")
            n = count_elements(shape, where)
            if n != len(data):
                raise InvalidInput(f"{where}: shape {shape} needs {n} values, got {len(data)}")
            if dt is object:
                arr = np.empty(len(data), dtype=object)
                arr[:] = [d.encode() if isinstance(d, str) else d for d in data]
            elif dt is None:
                arr = _loose_array(data, where)
                if arr.ndim != 1:
                    raise InvalidInput(f"{where}: 'data' must be a flat list")
            else:
                if any(isinstance(d, (str, list, dict)) for d in data):
                    raise InvalidInput(f"{where}: 'data' must be a flat list of numbers for {dtype_s}")
                arr = np.asarray(data, dtype=dt)
                if arr.ndim != 1:
                    raise InvalidInput(f"{where}: 'data' must be a flat list")
            return InputTensor(arr.reshape(shape), loose=dt is None)
        if isinstance(value, (list, int, float, bool)):
            return InputTensor(_loose_array(value, where), loose=True)
    except InvalidInput:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise InvalidInput(f"{where}: {str(exc)[:200]}") from None
    raise InvalidInput(f"{where}: expected a nested list or {{'shape', 'dtype', 'data'}}")


def decode_json(body: bytes) -> DecodedRequest:
    obj = _json_loads(body)
    if not isinstance(obj, dict) or not isinstance(obj.get("inputs"), dict):
        raise InvalidInput('cannot decode request as json: expected {"inputs": {name: values}}')
    inputs = obj["inputs"]
    if len(inputs) > MAX_INPUTS:
        raise InvalidInput(f"too many inputs ({len(inputs)} > {MAX_INPUTS})")
    outputs = obj.get("outputs") or []
    if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        raise InvalidInput("'outputs' must be a list of output names")
    req = DecodedRequest("json", output_names=list(outputs))
    for name, value in inputs.items():
        req.named[name] = _json_tensor(name, value)
    return req


def _json_default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError


def _json_data(arr: np.ndarray) -> Any:
    if arr.dtype.kind in "OUS":
        return [
            v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in arr.ravel().tolist()
        ]
    if arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    flat = np.ascontiguousarray(arr).ravel()
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():
        # JSON has no NaN/Infinity: encode them as null.
        return [None if not math.isfinite(v) else v for v in flat.tolist()]
    return flat


def encode_json_response(outputs: Iterable[tuple[str, np.ndarray]]) -> bytes:
    doc = {
        "outputs": {
            name: {"dtype": dtype_name(arr.dtype), "shape": list(arr.shape), "data": _json_data(arr)}
            for name, arr in outputs
        }
    }
    if _orjson is not None:
        return _orjson.dumps(doc, option=_orjson.OPT_SERIALIZE_NUMPY, default=_json_default)
    return json.dumps(
        doc, default=lambda o: o.tolist() if isinstance(o, np.ndarray) else _json_default(o)
    ).encode()
