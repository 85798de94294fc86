"""Open Inference Protocol (V2) tensors in their raw form, shared by the REST and gRPC adapters.

The binary tensor data extension of V2 REST and gRPC's ``raw_input_contents`` /
``raw_output_contents`` carry a tensor the same way: its elements little-endian and
row-major, back to back; a BYTES element is its length as a 4-byte little-endian integer
followed by its bytes. Numeric tensors are read as numpy views over the received buffer
(no copy); the size a shape promises is checked against the bytes actually received
before anything is allocated.

Inference itself runs in the onnx processor's TF protobuf form (the EAS codec), so a V2
call costs a worker what an EAS ``TFRequest`` costs: :func:`tf_request` builds it and
:func:`tf_outputs` reads the answer back as arrays.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from gateway.core.metadata import DATATYPES, declared_dtypes
from gateway.core.tensors import TensorError, tf_outputs, tf_request

_BY_KIND: dict[tuple[str, int], str] = {
    (dt.kind, dt.itemsize): name for name, dt in DATATYPES.items() if name != "BYTES"
}
# The same for the native numeric dtypes, looked up without a call on every answer.
BY_DTYPE: dict[np.dtype[Any], str] = {dt: name for name, dt in DATATYPES.items() if name != "BYTES"}
_LENGTH = struct.Struct("<I")
MAX_ELEMENTS = 1 << 28  # per tensor, as the processors' own cap


def datatype_of(arr: np.ndarray) -> str:
    """The V2 datatype of an array (object, str and bytes arrays are BYTES)."""
    dt = arr.dtype
    if dt.kind in "OSU":
        return "BYTES"
    try:
        return _BY_KIND[(dt.kind, dt.itemsize)]
    except KeyError:
        raise TensorError(f"no V2 datatype for numpy {dt}") from None


def check_shape(shape: Any, where: str) -> list[int]:
    """A shape as a list of non-negative ints whose element count stays under the cap."""
    if not isinstance(shape, (list, tuple)):
        raise TensorError(f"{where}: shape must be a list of non-negative integers")
    for d in shape:  # a loop, not all() over a generator: this runs on every call
        if type(d) is not int or d < 0:
            raise TensorError(f"{where}: shape must be a list of non-negative integers")
    if math.prod(shape) > MAX_ELEMENTS:
        raise TensorError(f"{where}: shape {list(shape)} has more than {MAX_ELEMENTS} elements")
    return list(shape)


def from_raw(buf: memoryview | bytes, datatype: str, shape: Sequence[int], where: str) -> np.ndarray:
    """The tensor ``buf`` holds, checked against ``datatype`` and ``shape``.

    Numeric tensors are read-only views over ``buf``; BYTES tensors are object arrays of
    bytes. Any size mismatch raises :class:`TensorError` naming ``where``."""
    dims = check_shape(list(shape), where)
    count = math.prod(dims)
    dt = DATATYPES.get(datatype)
    if dt is None:
        raise TensorError(f"{where}: datatype {str(datatype)[:32]!r} is not one of {', '.join(DATATYPES)}")
    view = memoryview(buf).cast("B")
    if datatype == "BYTES":
        return _bytes_elements(view, count, where).reshape(dims)
    if len(view) != count * dt.itemsize:
        raise TensorError(
            f"{where}: {datatype} shape {dims} needs {count * dt.itemsize} bytes, got {len(view)}"
        )
    arr = np.frombuffer(view, dtype=dt, count=count)
    if datatype == "BOOL" and arr.size and int(arr.view(np.uint8).max()) > 1:
        raise TensorError(f"{where}: BOOL elements must be 0 or 1")
    return arr.reshape(dims)


def _bytes_elements(view: memoryview, count: int, where: str) -> np.ndarray:
    # Every element takes at least its 4-byte length: a count the buffer cannot hold is
    # refused before the object array is allocated.
    if count * _LENGTH.size > len(view):
        raise TensorError(f"{where}: BYTES shape needs {count} elements, the data cannot hold them")
    out = np.empty(count, dtype=object)
    pos, end = 0, len(view)
    for i in range(count):
        if pos + _LENGTH.size > end:
            raise TensorError(f"{where}: BYTES element {i} is cut short")
        (n,) = _LENGTH.unpack_from(view, pos)
        pos += _LENGTH.size
        if pos + n > end:
            raise TensorError(f"{where}: BYTES element {i} says {n} bytes, fewer remain")
        out[i] = bytes(view[pos : pos + n])
        pos += n
    if pos != end:
        raise TensorError(f"{where}: {end - pos} bytes left over after {count} BYTES elements")
    return out


def to_raw(arr: np.ndarray) -> bytes | memoryview:
    """``arr`` in the raw V2 form (a view of its memory when it is contiguous little-endian)."""
    if arr.dtype.kind in "OSU":
        parts: list[bytes] = []
        for item in arr.reshape(-1):
            b = item.encode() if isinstance(item, str) else bytes(item)
            parts.append(_LENGTH.pack(len(b)))
            parts.append(b)
        return b"".join(parts)
    wire = DATATYPES[datatype_of(arr)]
    out = np.ascontiguousarray(arr, dtype=wire)
    return memoryview(out).cast("B")


__all__ = [
    "BY_DTYPE",
    "DATATYPES",
    "MAX_ELEMENTS",
    "TensorError",
    "check_shape",
    "datatype_of",
    "declared_dtypes",
    "from_raw",
    "tf_outputs",
    "tf_request",
    "to_raw",
]
