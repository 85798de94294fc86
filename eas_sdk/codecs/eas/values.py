"""Conversion of Python and numpy values to what the EAS wire carries, with validation.

The checks mirror what protobuf (and so eas-prediction) accepts: ints for float fields are
fine, floats for integer fields are not, int32 fields are range-checked, strings must be
bytes in requests. Errors are TypeError/ValueError naming the tensor (``what``).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .dtypes import FLT_MAX, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, Kind
from .wire import encode_varints, raw_bytes


def _describe(what: str) -> str:
    return what or "tensor"


def _numeric_array(content: Any, what: str) -> np.ndarray:
    """Content as an ndarray of a numeric kind (b, i, u, f); TypeError for anything else."""
    if isinstance(content, np.ndarray):
        arr = content
    elif isinstance(content, (str, bytes, bytearray)):
        raise TypeError(f"{_describe(what)}: content must be numeric, got {type(content).__name__}")
    else:
        if not isinstance(content, (list, tuple, numbers.Number, np.generic)):
            content = list(content) if isinstance(content, Iterable) else content
        arr = np.asarray(content)
    if arr.dtype.kind in "biuf":
        return arr
    if arr.dtype.kind == "O":
        # Mixed or huge Python ints: accept only real numbers, never strings.
        flat = arr.ravel().tolist()
        for v in flat:
            if not isinstance(v, numbers.Real) or isinstance(v, (str, bytes)):
                raise TypeError(f"{_describe(what)}: non-numeric value {v!r} ({type(v).__name__})")
        if all(isinstance(v, numbers.Integral) for v in flat):
            ints = [int(v) for v in flat]
            lo, hi = (min(ints), max(ints)) if ints else (0, 0)
            if lo < INT64_MIN or hi > (1 << 64) - 1:
                raise ValueError(f"{_describe(what)}: integer value out of 64-bit range")
            out = np.array(ints, dtype=np.uint64 if lo >= 0 and hi > INT64_MAX else np.int64)
        else:
            out = np.array([float(v) for v in flat], dtype=np.float64)
        return out.reshape(arr.shape)
    raise TypeError(f"{_describe(what)}: content must be numeric, got numpy dtype {arr.dtype}")


def _check_int_range(arr: np.ndarray, lo: int, hi: int, what: str, label: str) -> None:
    if arr.size == 0:
        return
    info = np.iinfo(arr.dtype) if arr.dtype.kind in "iu" else None
    if info is not None and info.min >= lo and info.max <= hi:
        return
    amin, amax = int(arr.min()), int(arr.max())
    if amin < lo or amax > hi:
        bad = amin if amin < lo else amax
        raise ValueError(f"{_describe(what)}: value {bad} out of {label} range")


def _bytes_list(content: Any, what: str) -> list[bytes]:
    if isinstance(content, (bytes, bytearray, memoryview)):
        items: list[Any] = [content]
    elif isinstance(content, str):
        raise TypeError(f"{_describe(what)}: DT_STRING needs bytes, got str (use .encode())")
    elif isinstance(content, np.ndarray):
        if content.dtype.kind == "U":
            raise TypeError(
                f"{_describe(what)}: DT_STRING needs bytes, got a numpy str array (use .astype('S'))"
            )
        items = content.ravel().tolist()
    else:
        items = list(content)
    out: list[bytes] = []
    for v in items:
        if isinstance(v, bytes):
            out.append(v)
        elif isinstance(v, (bytearray, memoryview, np.bytes_)):
            out.append(bytes(v))
        elif isinstance(v, str):
            raise TypeError(f"{_describe(what)}: DT_STRING needs bytes, got str {v[:20]!r} (use .encode())")
        else:
            raise TypeError(f"{_describe(what)}: DT_STRING needs bytes, got {type(v).__name__}")
    return out


def to_wire_values(content: Any, kind: str, what: str = "") -> np.ndarray | list[bytes]:
    """Convert content to the flat, contiguous little-endian array that ``kind`` sends.

    Returns '<f4'/'<f8' for float/double, int64 for int32/int64 (sign-extended on the wire),
    bool for bool, and ``list[bytes]`` for bytes. Raises TypeError/ValueError naming ``what``.
    Checks mirror what protobuf (and so eas-prediction) accepts: ints for float fields are fine,
    floats for integer fields are not, int32 fields are range-checked.
    """
    if kind == Kind.BYTES:
        return _bytes_list(content, what)
    arr = _numeric_array(content, what)
    if kind == Kind.FLOAT:
        if arr.dtype == np.float32:
            return np.ascontiguousarray(arr, dtype="<f4").reshape(-1)
        src = arr.astype(np.float64, copy=False) if arr.dtype.kind != "f" else arr
        with np.errstate(over="ignore"):
            out = np.ascontiguousarray(src, dtype="<f4").reshape(-1)
        if src.dtype.itemsize > 4:
            # protobuf maps |x| > FLT_MAX to inf (numpy would round some of them down to FLT_MAX).
            big = np.abs(src.reshape(-1)) > FLT_MAX
            if big.any():
                out = out.copy()
                out[big] = np.copysign(np.inf, src.reshape(-1)[big])
        return out
    if kind == Kind.DOUBLE:
        return np.ascontiguousarray(arr, dtype="<f8").reshape(-1)
    if arr.size == 0:
        return np.empty(0, dtype=np.bool_ if kind == Kind.BOOL else np.int64)
    if arr.dtype.kind == "f":
        raise TypeError(f"{_describe(what)}: {kind} values must be integers, got floats ({arr.dtype})")
    if kind == Kind.BOOL:
        return arr.astype(np.bool_, copy=False).reshape(-1)
    if kind == Kind.INT32:
        _check_int_range(arr, INT32_MIN, INT32_MAX, what, "int32")
    elif kind == Kind.INT64:
        _check_int_range(arr, INT64_MIN, INT64_MAX, what, "int64")
    else:
        raise ValueError(f"unknown value kind {kind!r}")
    return arr.astype(np.int64, copy=False).reshape(-1)


def wire_payload(values: np.ndarray | list[bytes], kind: str, copy: bool = True) -> Any:
    """Packed payload of converted values (``list[bytes]`` passes through for strings).

    ``copy=False`` returns float/double payloads as a view of the array's memory: for an
    encoder that joins the message at once (a response), where a request that keeps its
    payload until sent must snapshot the caller's array (``copy=True``).
    """
    if kind == Kind.BYTES:
        return values
    arr = values
    assert isinstance(arr, np.ndarray)
    if kind in (Kind.FLOAT, Kind.DOUBLE):
        return arr.tobytes() if copy else raw_bytes(arr, arr.dtype.str)
    return encode_varints(arr)


def check_shape(shape: Any, what: str = "") -> list[int]:
    """Validate a shape: ints in int64 range, non-negative, product fits int64."""
    if isinstance(shape, np.ndarray):
        shape = shape.tolist()
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = [shape]
    try:
        dims = list(shape)
    except TypeError:
        raise TypeError(
            f"{_describe(what)}: shape must be a sequence of ints, got {type(shape).__name__}"
        ) from None
    out: list[int] = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"{_describe(what)}: shape dims must be ints, got {d!r}")
        d = int(d)
        if d < 0:
            raise ValueError(f"{_describe(what)}: negative dimension {d} in shape {dims}")
        if d > INT64_MAX:
            raise ValueError(f"{_describe(what)}: dimension {d} exceeds int64")
        out.append(d)
    total = 1
    for d in out:
        total *= d
    if total > INT64_MAX:
        raise ValueError(f"{_describe(what)}: shape {out} has {total} elements, more than int64 can count")
    return out


def shape_size(dims: Sequence[int]) -> int:
    total = 1
    for d in dims:
        total *= d
    return total


def response_strings(arr: np.ndarray) -> list[bytes]:
    """String values of an answer as bytes: str (a model's usual strings) as UTF-8, other
    values as their text, so whatever a model returns can be sent."""
    out: list[bytes] = []
    for v in arr.ravel().tolist():
        if isinstance(v, bytes):
            out.append(v)
        elif isinstance(v, (bytearray, memoryview)):
            out.append(bytes(v))
        else:
            out.append(str(v).encode("utf-8"))
    return out
