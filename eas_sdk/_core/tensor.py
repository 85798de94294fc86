"""Dtype tables and the fast numpy <-> protobuf codec of the EAS tensor protocols.

The EAS TF, Torch and Blade messages (fact sheet §2) are small envelopes around
packed repeated numeric fields. This module writes and reads that wire format
directly: encoding joins varint tag/length headers with the array's
little-endian bytes in one ``b"".join`` (no Python lists, no per-element work);
decoding scans the few envelope fields in Python and returns ``np.frombuffer``
views of the packed payloads (zero copy for float/double/fixed layouts; the
views are read-only and may be unaligned, call ``.copy()`` to own/align them).
Varint fields (int32, int64, bool, dims) use vectorised numpy varint
encoding/decoding. Output is byte-identical to protobuf's own serialisation
(fields in number order, map entries in insertion order, packed fields) and to
eas-prediction 0.36 wherever that client works.

Dtype tables
------------
``DT_*`` (TF/Torch ``ArrayDataType``) and ``BLADE_DT_*`` (Blade ``DataType``).
``NUMPY_DTYPES[dt]`` numpy dtype of a DT code; ``DT_NAMES[dt]`` its name;
``value_kind(dt, family)`` / ``value_field(dt, family)``: the value kind / field number a DT
uses (family "tf", "torch" or "blade"; Torch sends bools as int_val 0/1);
``dt_for_numpy(dtype, family, response=False)`` the DT code for a numpy dtype
(``response=True`` picks what the original client can read back, e.g. uint8 -> DT_INT32 for TF).
Field numbers: ``TF_FIELDS``, ``TORCH_FIELDS``, ``BLADE_FIELDS`` (and ``FIELDS[family]``) map a
value kind (``KIND_FLOAT``, ``KIND_DOUBLE``, ``KIND_INT32``, ``KIND_INT64``, ``KIND_BOOL``,
``KIND_BYTES``) to its field.

Value objects
-------------
``Tensor(array, dtype)``: a shaped ndarray plus its DT code (a NamedTuple).
``RawArray``: one decoded ArrayProto/Blade Array as on the wire (dtype, dims, flat value
fields, Blade names/batchsize) with ``to_tensor()`` for a validated, shaped Tensor.

Client side
-----------
``encode_tf_request(signature_name, inputs, output_filter=()) -> bytes``
``decode_tf_response(buf) -> dict[str, RawArray]``
``encode_torch_request(inputs, map_inputs=None, output_filter=(), debug_level=0) -> bytes``
``decode_torch_response(buf) -> (list[RawArray], dict[str, RawArray])``
``encode_blade_request(signature_name, inputs, output_info=()) -> bytes``
   inputs: sequence of ``BladeInput(name, array, batchsize=None, dtype=None)``;
   output_info: sequence of ``(name, blade_dt)``
``decode_blade_response(buf) -> list[RawArray]`` (``.name_in_dl_model`` and ``.batchsize`` set)

Server side
-----------
``decode_tf_request(buf) -> TFRequestData(signature_name, inputs: dict[str, Tensor], output_filter)``
``encode_tf_response(outputs: Mapping[str, ndarray | Tensor]) -> bytes``
``decode_torch_request(buf, compressed=False) -> TorchRequestData(inputs: list[Tensor | None],
   map_inputs: dict[str, Tensor], output_filter: list[int], debug_level)``
   (``compressed=None`` sniffs a snappy body, ``True`` requires one)
``encode_torch_response(outputs: Sequence[ndarray | Tensor], map_outputs=None) -> bytes``
``decode_blade_request(buf) -> BladeRequestData(signature_name, inputs: list[BladeTensor],
   output_info: list[(name, blade_dt)])``
``encode_blade_response(outputs: Mapping[str, ndarray] | Sequence[BladeInput]) -> bytes``

Inputs to the encoders may be ndarrays, Tensors or (for requests) nested lists; DT codes are
inferred from numpy dtypes when not given. Everything malformed raises ``CodecError`` (a
ValueError) for wire data, and ValueError/TypeError naming the tensor for bad values.
Decoders accept bytes, bytearray or memoryview; they follow protobuf's parsing rules
(unknown fields skipped, unpacked and split packed fields concatenated, last map key wins)
and check shape against value count only in ``to_tensor``/the server-side ``decode_*``.
A missing shape means a flat vector. Blade has no dtype on the wire: it is inferred from
the value field used (an empty Blade tensor decodes as float32). Not supported on the wire
(no value field): DT_HALF, DT_BFLOAT16, DT_COMPLEX*, DT_RESOURCE, DT_VARIANT.

Low-level building blocks used by ``eas_sdk.requests``: ``to_wire_values``, ``array_proto``,
``blade_array``, ``varint``, ``encode_varints``, ``decode_varints``.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

# ----------------------------------------------------------------------------- dtype tables
DT_INVALID = 0
DT_FLOAT = 1
DT_DOUBLE = 2
DT_INT32 = 3
DT_UINT8 = 4
DT_INT16 = 5
DT_INT8 = 6
DT_STRING = 7
DT_COMPLEX64 = 8
DT_INT64 = 9
DT_BOOL = 10
DT_QINT8 = 11
DT_QUINT8 = 12
DT_QINT32 = 13
DT_BFLOAT16 = 14
DT_QINT16 = 15
DT_QUINT16 = 16
DT_UINT16 = 17
DT_COMPLEX128 = 18
DT_HALF = 19
DT_RESOURCE = 20
DT_VARIANT = 21

DT_NAMES: dict[int, str] = {
    value: name
    for name, value in list(globals().items())
    if name.startswith("DT_") and isinstance(value, int) and name != "DT_NAMES"
}

BLADE_DT_UNKNOWN = 0
BLADE_DT_FLOAT = 1
BLADE_DT_INT32 = 2
BLADE_DT_INT64 = 3
BLADE_DT_STRING = 4
BLADE_DT_NAMES: dict[int, str] = {
    0: "DT_UNKNOWN",
    1: "DT_FLOAT",
    2: "DT_INT32",
    3: "DT_INT64",
    4: "DT_STRING",
}

# Value kinds: how a value travels on the wire.
KIND_FLOAT = "float"  # packed fixed32, '<f4'
KIND_DOUBLE = "double"  # packed fixed64, '<f8'
KIND_INT32 = "int32"  # packed varint, negative => 10-byte sign-extended varint
KIND_INT64 = "int64"  # packed varint
KIND_BOOL = "bool"  # packed varint 0/1
KIND_BYTES = "bytes"  # repeated length-delimited, one tag per element

TF_FIELDS: dict[str, int] = {
    KIND_FLOAT: 3,
    KIND_DOUBLE: 4,
    KIND_INT32: 5,
    KIND_BYTES: 6,
    KIND_INT64: 7,
    KIND_BOOL: 8,
}
TORCH_FIELDS: dict[str, int] = {KIND_FLOAT: 3, KIND_DOUBLE: 4, KIND_INT32: 5, KIND_BYTES: 6, KIND_INT64: 7}
BLADE_FIELDS: dict[str, int] = {KIND_FLOAT: 5, KIND_INT32: 6, KIND_INT64: 7, KIND_BYTES: 8}
FIELDS = {"tf": TF_FIELDS, "torch": TORCH_FIELDS, "blade": BLADE_FIELDS}

# Numpy dtype of each DT code that can carry values.
NUMPY_DTYPES: dict[int, np.dtype[Any]] = {
    DT_FLOAT: np.dtype(np.float32),
    DT_DOUBLE: np.dtype(np.float64),
    DT_INT32: np.dtype(np.int32),
    DT_UINT8: np.dtype(np.uint8),
    DT_INT16: np.dtype(np.int16),
    DT_INT8: np.dtype(np.int8),
    DT_STRING: np.dtype(object),
    DT_INT64: np.dtype(np.int64),
    DT_BOOL: np.dtype(np.bool_),
    DT_QINT8: np.dtype(np.int8),
    DT_QUINT8: np.dtype(np.uint8),
    DT_QINT32: np.dtype(np.int32),
    DT_QINT16: np.dtype(np.int16),
    DT_QUINT16: np.dtype(np.uint16),
    DT_UINT16: np.dtype(np.uint16),
}
BLADE_NUMPY_DTYPES: dict[int, np.dtype[Any]] = {
    BLADE_DT_FLOAT: np.dtype(np.float32),
    BLADE_DT_INT32: np.dtype(np.int32),
    BLADE_DT_INT64: np.dtype(np.int64),
    BLADE_DT_STRING: np.dtype(object),
}
BLADE_KINDS: dict[int, str] = {
    BLADE_DT_FLOAT: KIND_FLOAT,
    BLADE_DT_INT32: KIND_INT32,
    BLADE_DT_INT64: KIND_INT64,
    BLADE_DT_STRING: KIND_BYTES,
}

_INT32_DTS = (
    DT_INT8,
    DT_INT16,
    DT_INT32,
    DT_UINT8,
    DT_UINT16,
    DT_QINT8,
    DT_QINT16,
    DT_QINT32,
    DT_QUINT8,
    DT_QUINT16,
)
_TF_KINDS: dict[int, str] = {
    DT_FLOAT: KIND_FLOAT,
    DT_DOUBLE: KIND_DOUBLE,
    DT_INT64: KIND_INT64,
    DT_BOOL: KIND_BOOL,
    DT_STRING: KIND_BYTES,
    **dict.fromkeys(_INT32_DTS, KIND_INT32),
}
# Torch's ArrayProto has no bool_val: bools travel as int_val 0/1.
_TORCH_KINDS: dict[int, str] = {**_TF_KINDS, DT_BOOL: KIND_INT32}

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_FLT_MAX = float(np.finfo(np.float32).max)


class CodecError(ValueError):
    """Malformed or inconsistent wire data (maps to HTTP 400 on a server)."""


def value_kind(dt: int, family: str = "tf") -> str:
    """The value kind (``KIND_*``) that DT code ``dt`` uses in ``family`` ("tf", "torch", "blade")."""
    table = BLADE_KINDS if family == "blade" else (_TORCH_KINDS if family == "torch" else _TF_KINDS)
    try:
        return table[dt]
    except (KeyError, TypeError):
        names = BLADE_DT_NAMES if family == "blade" else DT_NAMES
        raise ValueError(f"unsupported {family} dtype {dt!r} ({names.get(dt, 'unknown')})") from None


def value_field(dt: int, family: str = "tf") -> int:
    """Protobuf field number that carries the values of DT code ``dt`` in ``family``."""
    return FIELDS[family][value_kind(dt, family)]


def numpy_dtype(dt: int, family: str = "tf") -> np.dtype[Any]:
    """Numpy dtype of DT code ``dt`` (object for strings); ValueError if it carries no values."""
    table = BLADE_NUMPY_DTYPES if family == "blade" else NUMPY_DTYPES
    try:
        return table[dt]
    except (KeyError, TypeError):
        raise ValueError(f"unsupported {family} dtype {dt!r}") from None


def dt_for_numpy(dtype: Any, family: str = "tf", response: bool = False) -> int:
    """DT code for a numpy dtype.

    ``response=True`` chooses what eas-prediction 0.36 can read back: for TF, uint8/uint16
    become DT_INT32 (its TFResponse returns None for UINT8/UINT16); for Torch, bool becomes DT_UINT8
    and uint16 DT_INT32. float16 widens to DT_FLOAT, uint32 to DT_INT64.
    """
    dt = np.dtype(dtype)
    k = dt.kind
    if family == "blade":
        if k == "f":
            return BLADE_DT_FLOAT
        if k in "iub":
            return (
                BLADE_DT_INT64 if dt.itemsize >= 4 and not (k == "i" and dt.itemsize == 4) else BLADE_DT_INT32
            )
        if k in "SOU":
            return BLADE_DT_STRING
        raise TypeError(f"no Blade dtype for numpy {dt}")
    if k == "f":
        return DT_DOUBLE if dt.itemsize == 8 else DT_FLOAT
    if k == "b":
        if family == "torch" and response:
            return DT_UINT8
        return DT_BOOL
    if k == "i":
        return {1: DT_INT8, 2: DT_INT16, 4: DT_INT32, 8: DT_INT64}[dt.itemsize]
    if k == "u":
        if dt.itemsize == 1:
            return DT_INT32 if (response and family == "tf") else DT_UINT8
        if dt.itemsize == 2:
            return DT_INT32 if response else DT_UINT16
        return DT_INT64
    if k in "SOU":
        return DT_STRING
    raise TypeError(f"no EAS dtype for numpy {dt}")


# ----------------------------------------------------------------------------- varints
_SMALL_VARINTS = [bytes([i]) for i in range(128)]


def varint(n: int) -> bytes:
    """Protobuf varint of ``n``; negative numbers are encoded as 64-bit two's complement."""
    if 0 <= n < 128:
        return _SMALL_VARINTS[n]
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


_THRESHOLDS = [np.uint64(1 << (7 * k)) for k in range(1, 10)]
_U7F = np.uint64(0x7F)


def encode_varints(values: np.ndarray) -> bytes:
    """Concatenated varints of an integer array (signed values are sign-extended to 64 bits).

    Vectorised by byte position: one pass per varint byte over the values that still have
    bytes left, scattering into a preallocated output (a dense (n, width) matrix when every
    value has the same length). Memory stays O(n).
    """
    arr = np.asarray(values)
    if arr.size == 0:
        return b""
    if arr.dtype == np.bool_ or (arr.dtype.kind == "u" and arr.dtype.itemsize == 1):
        return arr.astype(np.uint8, copy=False).tobytes()
    if arr.dtype.kind == "i":
        u = arr.astype(np.int64, copy=False).view(np.uint64).ravel()
    else:
        u = arr.astype(np.uint64, copy=False).ravel()
    mx = int(u.max())
    if mx < 0x80:
        return u.astype(np.uint8).tobytes()
    width = (mx.bit_length() + 6) // 7
    if max(1, (int(u.min()).bit_length() + 6) // 7) == width:
        dense = np.empty((u.size, width), dtype=np.uint8)
        for k in range(width):
            col = ((u >> np.uint64(7 * k)) & _U7F).astype(np.uint8)
            dense[:, k] = col | 0x80 if k < width - 1 else col
        return dense.tobytes()
    lengths = np.ones(u.size, dtype=np.int64)
    for k in range(1, width):
        lengths += u >= _THRESHOLDS[k - 1]
    ends = np.cumsum(lengths)
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    pos = ends - lengths
    vals, lens = u, lengths
    for k in range(width):
        more = lens > k + 1
        byte = (vals & _U7F).astype(np.uint8)
        byte |= more.view(np.uint8) << 7
        out[pos] = byte
        if k == width - 1:
            break
        vals, pos, lens = vals[more] >> np.uint64(7), pos[more] + 1, lens[more]
    return out.tobytes()


def decode_varints(data: np.ndarray | bytes | memoryview) -> np.ndarray:
    """Decode concatenated varints into a uint64 array (view as int64 for signed fields)."""
    b = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if b.size == 0:
        return np.empty(0, dtype=np.uint64)
    term = b < 0x80
    ends = np.flatnonzero(term)
    n = ends.size
    if n == b.size:
        return b.astype(np.uint64)
    if n == 0 or ends[-1] != b.size - 1:
        raise CodecError("truncated varint in packed field")
    width = b.size // n
    if b.size == n * width and width <= 10 and np.array_equal(ends, np.arange(width - 1, b.size, width)):
        out = (b[0::width] & 0x7F).astype(np.uint64)  # every varint has the same length
        for k in range(1, width):
            out |= (b[k::width] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        return out
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    maxlen = int(lengths.max())
    if maxlen > 10:
        raise CodecError("varint longer than 10 bytes")
    out = (b[starts] & 0x7F).astype(np.uint64)
    idx = np.arange(n)
    for k in range(1, maxlen):
        idx = idx[lengths[idx] > k]
        out[idx] |= (b[starts[idx] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    return out


# ----------------------------------------------------------------------------- value conversion
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
    if kind == KIND_BYTES:
        return _bytes_list(content, what)
    arr = _numeric_array(content, what)
    if kind == KIND_FLOAT:
        if arr.dtype == np.float32:
            return np.ascontiguousarray(arr, dtype="<f4").reshape(-1)
        src = arr.astype(np.float64, copy=False) if arr.dtype.kind != "f" else arr
        with np.errstate(over="ignore"):
            out = np.ascontiguousarray(src, dtype="<f4").reshape(-1)
        if src.dtype.itemsize > 4:
            # protobuf maps |x| > FLT_MAX to inf (numpy would round some of them down to FLT_MAX).
            big = np.abs(src.reshape(-1)) > _FLT_MAX
            if big.any():
                out = out.copy()
                out[big] = np.copysign(np.inf, src.reshape(-1)[big])
        return out
    if kind == KIND_DOUBLE:
        return np.ascontiguousarray(arr, dtype="<f8").reshape(-1)
    if arr.size == 0:
        return np.empty(0, dtype=np.bool_ if kind == KIND_BOOL else np.int64)
    if arr.dtype.kind == "f":
        raise TypeError(f"{_describe(what)}: {kind} values must be integers, got floats ({arr.dtype})")
    if kind == KIND_BOOL:
        return arr.astype(np.bool_, copy=False).reshape(-1)
    if kind == KIND_INT32:
        _check_int_range(arr, INT32_MIN, INT32_MAX, what, "int32")
    elif kind == KIND_INT64:
        _check_int_range(arr, INT64_MIN, INT64_MAX, what, "int64")
    else:
        raise ValueError(f"unknown value kind {kind!r}")
    return arr.astype(np.int64, copy=False).reshape(-1)


def wire_payload(values: np.ndarray | list[bytes], kind: str) -> bytes | list[bytes]:
    """Packed payload bytes of converted values (``list[bytes]`` passes through for strings)."""
    if kind == KIND_BYTES:
        return values  # type: ignore[return-value]
    arr = values
    assert isinstance(arr, np.ndarray)
    if kind in (KIND_FLOAT, KIND_DOUBLE):
        return arr.tobytes()
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


# ----------------------------------------------------------------------------- encoding
Pieces = list[Any]  # bytes | memoryview


class Tensor(NamedTuple):
    """A shaped ndarray and its EAS DT code."""

    array: np.ndarray
    dtype: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)


class BladeInput(NamedTuple):
    """One Blade tensor to encode; batchsize defaults to shape[0] (or 1), dtype from the array."""

    name: str
    array: Any
    batchsize: int | None = None
    dtype: int | None = None


class BladeTensor(NamedTuple):
    """One decoded Blade tensor (dtype inferred from the value field used)."""

    name: str
    array: np.ndarray
    dtype: int
    batchsize: int
    blade_blob_name: str


def _len_field(field_tag: bytes, pieces: Pieces, size: int) -> tuple[Pieces, int]:
    head = field_tag + varint(size)
    return [head, *pieces], len(head) + size


def _packed(field: int, chunks: Sequence[bytes]) -> tuple[Pieces, int]:
    size = sum(len(c) for c in chunks)
    if size == 0:
        return [], 0
    head = _tag(field, 2) + varint(size)
    return [head, *chunks], len(head) + size


def _strings(field: int, items: Iterable[bytes]) -> tuple[Pieces, int]:
    tag = _tag(field, 2)
    out: Pieces = []
    n = 0
    for s in items:
        head = tag + varint(len(s))
        out.append(head)
        out.append(s)
        n += len(head) + len(s)
    return out, n


def _dims_message(dims: Sequence[int]) -> bytes:
    payload = b"".join(varint(int(d)) for d in dims)
    if not payload:
        return b""
    return b"\x0a" + varint(len(payload)) + payload


def array_proto(
    dtype: int,
    dims: Sequence[int] | None,
    fields: Mapping[int, Sequence[Any]],
    kinds: Mapping[int, str],
) -> tuple[Pieces, int]:
    """Pieces and size of a TF/Torch ArrayProto.

    ``dims=None`` leaves array_shape out, ``[]`` writes an empty one (as protobuf does once
    the shape was touched). ``fields`` maps field number -> list of packed payload chunks
    (or, for bytes fields, of elements); ``kinds`` says which fields are bytes.
    """
    pieces: Pieces = []
    size = 0
    if dtype:
        head = b"\x08" + varint(dtype)
        pieces.append(head)
        size += len(head)
    if dims is not None:
        shape = _dims_message(dims)
        head = b"\x12" + varint(len(shape))
        pieces += [head, shape]
        size += len(head) + len(shape)
    for field in sorted(fields):
        chunks = fields[field]
        p, n = _strings(field, chunks) if kinds.get(field) == KIND_BYTES else _packed(field, chunks)
        pieces += p
        size += n
    return pieces, size


_TF_FIELD_KINDS = {v: k for k, v in TF_FIELDS.items()}
_TORCH_FIELD_KINDS = {v: k for k, v in TORCH_FIELDS.items()}
_BLADE_FIELD_KINDS = {v: k for k, v in BLADE_FIELDS.items()}


def _as_tensor(value: Any, family: str, what: str, response: bool) -> tuple[int, list[int], int, Any]:
    """(dtype, dims, field, payload) for an ndarray/Tensor/list value."""
    if isinstance(value, Tensor):
        arr, dt = np.asarray(value.array), value.dtype
    else:
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        dt = dt_for_numpy(arr.dtype, family, response=response)
    kind = value_kind(dt, family)
    if kind == KIND_BYTES and arr.dtype.kind == "U":
        arr = np.char.encode(arr, "utf-8") if response else arr
    dims = check_shape(arr.shape, what)
    values = to_wire_values(arr, kind, what)
    return dt, dims, FIELDS[family][kind], wire_payload(values, kind)


def _tensor_proto(value: Any, family: str, what: str, response: bool) -> tuple[Pieces, int]:
    dt, dims, field, payload = _as_tensor(value, family, what, response)
    kinds = _TF_FIELD_KINDS if family == "tf" else _TORCH_FIELD_KINDS
    chunks = payload if isinstance(payload, list) else [payload]
    return array_proto(dt, dims, {field: chunks}, kinds)


def map_entry(field_tag: bytes, key: str, value_pieces: Pieces, value_size: int) -> tuple[Pieces, int]:
    """Pieces of one ``map<string, Message>`` entry (key and value are always written)."""
    kb = key.encode("utf-8")
    inner_head = b"\x0a" + varint(len(kb))
    value_head = b"\x12" + varint(value_size)
    entry_size = len(inner_head) + len(kb) + len(value_head) + value_size
    head = field_tag + varint(entry_size)
    return [head, inner_head, kb, value_head, *value_pieces], len(head) + entry_size


def _string_field(field_tag: bytes, s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return field_tag + varint(len(b)) + b


def encode_tf_request(
    signature_name: str | None,
    inputs: Mapping[str, Any],
    output_filter: Sequence[str] = (),
) -> bytes:
    """Serialize a TF ``PredictRequest`` from ndarrays/Tensors (DT inferred from numpy dtype)."""
    pieces: Pieces = []
    if signature_name:
        pieces.append(_string_field(b"\x0a", signature_name))
    for name, value in inputs.items():
        vp, vs = _tensor_proto(value, "tf", f"input {name!r}", response=False)
        pieces += map_entry(b"\x12", name, vp, vs)[0]
    for out in output_filter:
        pieces.append(_string_field(b"\x1a", out))
    return b"".join(pieces)


def encode_tf_response(outputs: Mapping[str, Any]) -> bytes:
    """Serialize a TF ``PredictResponse``; dtypes chosen so eas-prediction 0.36 can read them."""
    pieces: Pieces = []
    for name, value in outputs.items():
        vp, vs = _tensor_proto(value, "tf", f"output {name!r}", response=True)
        pieces += map_entry(b"\x0a", name, vp, vs)[0]
    return b"".join(pieces)


def encode_torch_request(
    inputs: Sequence[Any],
    map_inputs: Mapping[str, Any] | None = None,
    output_filter: Sequence[int] = (),
    debug_level: int = 0,
) -> bytes:
    """Serialize a Torch ``PredictRequest``; a None input is written as an empty ArrayProto."""
    pieces: Pieces = []
    for i, value in enumerate(inputs):
        if value is None:
            pieces.append(b"\x0a\x00")
            continue
        vp, vs = _tensor_proto(value, "torch", f"input {i}", response=False)
        pieces += _len_field(b"\x0a", vp, vs)[0]
    if output_filter:
        payload = encode_varints(to_wire_values(list(output_filter), KIND_INT32, "output_filter"))
        pieces += [b"\x12", varint(len(payload)), payload]
    for name, value in (map_inputs or {}).items():
        vp, vs = _tensor_proto(value, "torch", f"map input {name!r}", response=False)
        pieces += map_entry(b"\x1a", name, vp, vs)[0]
    if debug_level:
        pieces.append(b"\xa0\x06" + varint(int(debug_level)))
    return b"".join(pieces)


def encode_torch_response(outputs: Sequence[Any], map_outputs: Mapping[str, Any] | None = None) -> bytes:
    """Serialize a Torch ``PredictResponse`` (positional outputs, then map_outputs)."""
    pieces: Pieces = []
    for i, value in enumerate(outputs):
        vp, vs = _tensor_proto(value, "torch", f"output {i}", response=True)
        pieces += _len_field(b"\x0a", vp, vs)[0]
    for name, value in (map_outputs or {}).items():
        vp, vs = _tensor_proto(value, "torch", f"map output {name!r}", response=True)
        pieces += map_entry(b"\x12", name, vp, vs)[0]
    return b"".join(pieces)


def blade_array(
    name: str,
    batchsize: int,
    dims: Sequence[int] | None,
    fields: Mapping[int, Sequence[Any]],
    blob_name: str | None = None,
) -> tuple[Pieces, int]:
    """Pieces and size of a Blade ``Array`` (proto2: names and batchsize always present)."""
    head = (
        _string_field(b"\x0a", name if blob_name is None else blob_name)
        + _string_field(b"\x12", name)
        + b"\x18"
        + varint(int(batchsize))
    )
    pieces: Pieces = [head]
    size = len(head)
    if dims is not None:
        shape = _dims_message(dims)
        sh = b"\x22" + varint(len(shape)) + shape
        pieces.append(sh)
        size += len(sh)
    for field in sorted(fields):
        chunks = fields[field]
        p, n = (
            _strings(field, chunks) if _BLADE_FIELD_KINDS.get(field) == KIND_BYTES else _packed(field, chunks)
        )
        pieces += p
        size += n
    return pieces, size


def _blade_value(item: BladeInput | tuple[str, Any], what_prefix: str) -> tuple[Pieces, int]:
    if not isinstance(item, BladeInput):
        item = BladeInput(*item)
    what = f"{what_prefix} {item.name!r}"
    arr = item.array if isinstance(item.array, np.ndarray) else np.asarray(item.array)
    if arr.dtype.kind == "U":
        arr = np.char.encode(arr, "utf-8")
    dt = item.dtype if item.dtype is not None else dt_for_numpy(arr.dtype, "blade")
    kind = value_kind(dt, "blade")
    if kind == KIND_FLOAT and arr.dtype.kind == "f" and arr.dtype.itemsize > 4:
        arr = arr.astype(np.float32)  # Blade has no double field
    dims = check_shape(arr.shape, what)
    batch = item.batchsize if item.batchsize is not None else (dims[0] if dims and dims[0] > 0 else 1)
    payload = wire_payload(to_wire_values(arr, kind, what), kind)
    chunks = payload if isinstance(payload, list) else [payload]
    return blade_array(item.name, batch, dims, {BLADE_FIELDS[kind]: chunks})


def encode_blade_request(
    signature_name: str | None,
    inputs: Sequence[BladeInput | tuple[str, Any]],
    output_info: Sequence[tuple[str, int]] = (),
) -> bytes:
    """Serialize a Blade ``Request`` (signature omitted when None)."""
    pieces: Pieces = []
    if signature_name is not None:
        pieces.append(_string_field(b"\x0a", signature_name))
    for item in inputs:
        vp, vs = _blade_value(item, "input")
        pieces += _len_field(b"\x12", vp, vs)[0]
    for name, dt in output_info:
        pieces.append(b"\x1a" + varint(len(oi := output_info_bytes(name, dt))) + oi)
    return b"".join(pieces)


def output_info_bytes(name: str, dt: int) -> bytes:
    """A Blade ``OutputInfo`` message body (both names set to ``name``)."""
    return _string_field(b"\x0a", name) + _string_field(b"\x12", name) + b"\x18" + varint(int(dt))


def encode_blade_response(outputs: Mapping[str, Any] | Sequence[BladeInput]) -> bytes:
    """Serialize a Blade ``Response``; batchsize defaults to shape[0] (proto2 requires it)."""
    items = [BladeInput(k, v) for k, v in outputs.items()] if isinstance(outputs, Mapping) else outputs
    pieces: Pieces = []
    for item in items:
        vp, vs = _blade_value(item, "output")
        pieces += _len_field(b"\x0a", vp, vs)[0]
    return b"".join(pieces)


# ----------------------------------------------------------------------------- decoding
_EMPTY_U64 = np.empty(0, dtype=np.uint64)


def _read_varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise CodecError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise CodecError("varint longer than 10 bytes")


def _fields(buf: Any, pos: int, end: int) -> Iterable[tuple[int, int, int, int]]:
    """Yield (field, wire_type, a, b): varint -> (value, 0); LEN/I32/I64 -> byte span [a, b)."""
    # One-byte varints (keys of fields 1-15, lengths < 128, small values) are read inline:
    # most of a small message's varints, and a function call each saved.
    while pos < end:
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _read_varint(buf, pos, end)
        field, wt = key >> 3, key & 7
        if field == 0:
            raise CodecError("field number 0")
        if wt == 0:
            if pos < end and (value := buf[pos]) < 0x80:
                pos += 1
            else:
                value, pos = _read_varint(buf, pos, end)
            yield field, 0, value, 0
        elif wt == 2:
            if pos < end and (n := buf[pos]) < 0x80:
                pos += 1
            else:
                n, pos = _read_varint(buf, pos, end)
            stop = pos + n
            if stop > end:
                raise CodecError("length-delimited field runs past the end")
            yield field, 2, pos, stop
            pos = stop
        elif wt == 5 or wt == 1:
            stop = pos + (4 if wt == 5 else 8)
            if stop > end:
                raise CodecError("fixed field runs past the end")
            yield field, wt, pos, stop
            pos = stop
        else:
            raise CodecError(f"unsupported wire type {wt}")


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _text(buf: Any, a: int, b: int) -> str:
    try:
        return bytes(buf[a:b]).decode("utf-8")
    except UnicodeDecodeError:
        raise CodecError("invalid UTF-8 in a string field") from None


_WIRE_NP = {KIND_FLOAT: np.dtype("<f4"), KIND_DOUBLE: np.dtype("<f8")}


def _numeric_piece(buf: Any, kind: str, wt: int, a: int, b: int) -> np.ndarray:
    """Values of one occurrence of a numeric field, packed (wt 2) or not."""
    if wt == 2 and a == b:
        return _EMPTY_VALUES[kind]
    if kind in _WIRE_NP:
        dt = _WIRE_NP[kind]
        want = 5 if kind == KIND_FLOAT else 1
        if wt == 2:
            if (b - a) % dt.itemsize:
                raise CodecError(f"packed {kind} field length {b - a} is not a multiple of {dt.itemsize}")
            return np.frombuffer(buf, dtype=dt, count=(b - a) // dt.itemsize, offset=a)
        if wt != want:
            raise CodecError(f"wrong wire type {wt} for a {kind} field")
        return np.frombuffer(buf, dtype=dt, count=1, offset=a)
    if wt == 2:
        raw = decode_varints(np.frombuffer(buf, dtype=np.uint8, count=b - a, offset=a))
    elif wt == 0:
        raw = np.array([a], dtype=np.uint64)
    else:
        raise CodecError(f"wrong wire type {wt} for a {kind} field")
    if kind == KIND_INT32:
        return raw.astype(np.uint32).view(np.int32)
    if kind == KIND_INT64:
        return raw.view(np.int64)
    return raw != 0  # bool


_EMPTY_VALUES = {
    KIND_FLOAT: np.empty(0, dtype="<f4"),
    KIND_DOUBLE: np.empty(0, dtype="<f8"),
    KIND_INT32: np.empty(0, dtype=np.int32),
    KIND_INT64: np.empty(0, dtype=np.int64),
    KIND_BOOL: np.empty(0, dtype=np.bool_),
}
for _v in _EMPTY_VALUES.values():
    _v.flags.writeable = False


class RawArray:
    """One decoded TF/Torch ArrayProto or Blade Array, as on the wire.

    ``dims`` is None when the message had no shape; ``values(kind)`` is the flat array of a
    value field (read-only views where possible) or ``list[bytes]`` for strings.
    """

    __slots__ = ("_values", "batchsize", "blade_blob_name", "dims", "dtype", "family", "name_in_dl_model")

    def __init__(self, family: str) -> None:
        self.family = family
        self.dtype = 0
        self.dims: list[int] | None = None
        self._values: dict[str, list[Any]] = {}
        self.batchsize = 0
        self.blade_blob_name = ""
        self.name_in_dl_model = ""

    def __repr__(self) -> str:
        filled = {k: self.count(k) for k in self._values}
        return f"RawArray({self.family}, dtype={self.dtype}, dims={self.dims}, values={filled})"

    def count(self, kind: str) -> int:
        return sum(len(p) for p in self._values.get(kind, ()))

    def kinds(self) -> list[str]:
        """Value kinds that carry at least one value."""
        return [k for k in self._values if self.count(k)]

    def values(self, kind: str) -> np.ndarray | list[bytes]:
        parts = self._values.get(kind)
        if kind == KIND_BYTES:
            return [s for p in parts for s in p] if parts else []
        if not parts:
            return _EMPTY_VALUES[kind]
        if len(parts) == 1:
            return parts[0]  # type: ignore[no-any-return]
        return np.concatenate(parts)

    def shape(self) -> list[int]:
        return list(self.dims) if self.dims else []

    def blade_dtype(self) -> int:
        for kind, dt in ((KIND_FLOAT, 1), (KIND_INT32, 2), (KIND_INT64, 3), (KIND_BYTES, 4)):
            if self.count(kind):
                return dt
        return BLADE_DT_UNKNOWN

    def to_tensor(self, what: str = "tensor", dtype: int | None = None) -> Tensor:
        """Validated, shaped Tensor: values from the DT's field, cast to its numpy dtype.

        A missing shape means a flat vector; a shape whose product differs from the value
        count raises CodecError. Blade arrays infer their dtype from the field used unless
        ``dtype`` (a Blade DT) is given.
        """
        if self.family == "blade":
            dt = self.blade_dtype() if dtype is None else dtype
            if dt == BLADE_DT_UNKNOWN:
                dt = BLADE_DT_FLOAT
            kind = value_kind(dt, "blade")
            target = BLADE_NUMPY_DTYPES[dt]
        else:
            dt = self.dtype if dtype is None else dtype
            try:
                kind = value_kind(dt, self.family)
                target = NUMPY_DTYPES[dt]
            except (ValueError, KeyError):
                raise CodecError(f"{what}: unsupported dtype {DT_NAMES.get(dt, dt)}") from None
            others = [k for k in self.kinds() if k != kind]
            if others and not self.count(kind):
                raise CodecError(
                    f"{what}: {DT_NAMES.get(dt, dt)} values expected in the {kind} field, got {others}"
                )
        vals = self.values(kind)
        n = len(vals)
        if self.dims is None:
            dims = [n]
        else:
            dims = list(self.dims)
            if any(d < 0 for d in dims):
                raise CodecError(f"{what}: negative dimension in shape {dims}")
            if shape_size(dims) != n:
                raise CodecError(f"{what}: shape {dims} needs {shape_size(dims)} values, got {n}")
        if kind == KIND_BYTES:
            arr = np.empty(n, dtype=object)
            arr[:] = vals
        else:
            assert isinstance(vals, np.ndarray)
            arr = vals
            if arr.dtype != target:
                if target.kind in "iu":
                    info = np.iinfo(target)
                    if arr.size and (int(arr.min()) < info.min or int(arr.max()) > info.max):
                        raise CodecError(f"{what}: value out of range for {DT_NAMES.get(dt, dt)}")
                arr = arr.astype(target)
        return Tensor(arr.reshape(dims), dt)


def _add_values(out: RawArray, kind: str, buf: Any, wt: int, x: int, y: int) -> None:
    """Append one occurrence of a value field (TF/Torch ArrayProto or Blade Array) to ``out``."""
    if kind == KIND_BYTES:
        if wt != 2:
            raise CodecError("string_val must be length-delimited")
        out._values.setdefault(kind, []).append([bytes(buf[x:y])])
    else:
        out._values.setdefault(kind, []).append(_numeric_piece(buf, kind, wt, x, y))


def _decode_array_proto(buf: Any, a: int, b: int, family: str) -> RawArray:
    kinds = _TF_FIELD_KINDS if family == "tf" else _TORCH_FIELD_KINDS
    out = RawArray(family)
    for field, wt, x, y in _fields(buf, a, b):
        if field == 1 and wt == 0:
            out.dtype = _int32(x)
        elif field == 2 and wt == 2:
            dims = [] if out.dims is None else out.dims
            dims += _decode_dims(buf, x, y)
            out.dims = dims
        elif field in kinds:
            _add_values(out, kinds[field], buf, wt, x, y)
        # unknown fields are skipped, as protobuf does
    return out


def _decode_dims(buf: Any, a: int, b: int) -> list[int]:
    dims: list[int] = []
    for field, wt, x, y in _fields(buf, a, b):
        if field != 1:
            continue
        if wt == 2 and y - x <= 32:
            pos = x  # a handful of dims: a Python loop beats numpy's set-up cost
            while pos < y:
                v, pos = _read_varint(buf, pos, y)
                dims.append(_signed64(v))
        elif wt == 2:
            packed = np.frombuffer(buf, dtype=np.uint8, count=y - x, offset=x)
            dims += decode_varints(packed).view(np.int64).tolist()
        elif wt == 0:
            dims.append(_signed64(x))
        else:
            raise CodecError("shape dims must be varints")
    return dims


def _decode_map_entry(buf: Any, a: int, b: int, family: str) -> tuple[str, RawArray]:
    key = ""
    value: RawArray | None = None
    for field, wt, x, y in _fields(buf, a, b):
        if field == 1 and wt == 2:
            key = _text(buf, x, y)
        elif field == 2 and wt == 2:
            value = _decode_array_proto(buf, x, y, family)
    return key, value if value is not None else RawArray(family)


def _as_buffer(buf: Any) -> Any:
    if isinstance(buf, (bytes, bytearray)):
        return buf
    if isinstance(buf, memoryview):
        return buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf
    if isinstance(buf, str):
        raise TypeError("expected bytes, got str")
    return memoryview(buf).cast("B")


def decode_tf_response(buf: Any) -> dict[str, RawArray]:
    """Parse a TF ``PredictResponse`` into ``{name: RawArray}`` (duplicate keys: last wins)."""
    buf = _as_buffer(buf)
    outputs: dict[str, RawArray] = {}
    for field, wt, x, y in _fields(buf, 0, len(buf)):
        if field == 1 and wt == 2:
            k, v = _decode_map_entry(buf, x, y, "tf")
            outputs[k] = v
    return outputs


class TFRequestData(NamedTuple):
    signature_name: str
    inputs: dict[str, Tensor]
    output_filter: list[str]


def decode_tf_request_raw(buf: Any) -> tuple[str, dict[str, RawArray], list[str]]:
    """Parse a TF ``PredictRequest`` without validating tensors."""
    buf = _as_buffer(buf)
    sig = ""
    inputs: dict[str, RawArray] = {}
    filt: list[str] = []
    for field, wt, x, y in _fields(buf, 0, len(buf)):
        if wt != 2:
            continue
        if field == 1:
            sig = _text(buf, x, y)
        elif field == 2:
            k, v = _decode_map_entry(buf, x, y, "tf")
            inputs[k] = v
        elif field == 3:
            filt.append(_text(buf, x, y))
    return sig, inputs, filt


def decode_tf_request(buf: Any) -> TFRequestData:
    """Server side: parse and validate a TF ``PredictRequest`` into shaped Tensors."""
    sig, raw, filt = decode_tf_request_raw(buf)
    return TFRequestData(sig, {k: v.to_tensor(f"input {k!r}") for k, v in raw.items()}, filt)


def decode_torch_response(buf: Any) -> tuple[list[RawArray], dict[str, RawArray]]:
    """Parse a Torch ``PredictResponse`` into (positional outputs, map outputs)."""
    buf = _as_buffer(buf)
    outputs: list[RawArray] = []
    map_outputs: dict[str, RawArray] = {}
    for field, wt, x, y in _fields(buf, 0, len(buf)):
        if wt != 2:
            continue
        if field == 1:
            outputs.append(_decode_array_proto(buf, x, y, "torch"))
        elif field == 2:
            k, v = _decode_map_entry(buf, x, y, "torch")
            map_outputs[k] = v
    return outputs, map_outputs


class TorchRequestData(NamedTuple):
    inputs: list[Tensor | None]
    map_inputs: dict[str, Tensor]
    output_filter: list[int]
    debug_level: int


_SNAPPY_MAX_RATIO = 24  # snappy cannot expand more than ~21x; refuse bigger claims before allocating


def _snappy_decompress(buf: Any) -> bytes:
    import cramjam  # local: only snappy bodies need it

    data = bytes(buf)
    claimed, _ = _read_varint(data, 0, min(len(data), 10))
    if claimed > _SNAPPY_MAX_RATIO * len(data) + 64:
        raise CodecError("snappy body claims an impossible uncompressed size")
    try:
        return bytes(cramjam.snappy.decompress_raw(data))
    except Exception as exc:
        raise CodecError(f"invalid snappy body: {exc}") from None


def decode_torch_request_raw(buf: Any) -> tuple[list[RawArray], dict[str, RawArray], list[int], int]:
    buf = _as_buffer(buf)
    inputs: list[RawArray] = []
    map_inputs: dict[str, RawArray] = {}
    filt: list[int] = []
    debug = 0
    for field, wt, x, y in _fields(buf, 0, len(buf)):
        if field == 1 and wt == 2:
            inputs.append(_decode_array_proto(buf, x, y, "torch"))
        elif field == 2:
            filt += _numeric_piece(buf, KIND_INT32, wt, x, y).tolist()
        elif field == 3 and wt == 2:
            k, v = _decode_map_entry(buf, x, y, "torch")
            map_inputs[k] = v
        elif field == 100 and wt == 0:
            debug = _int32(x)
    return inputs, map_inputs, filt, debug


def decode_torch_request(buf: Any, compressed: bool | None = False) -> TorchRequestData:
    """Server side: parse and validate a Torch ``PredictRequest``.

    ``compressed=True`` snappy-decompresses first (TorchRequest(flag=True) bodies; nothing on
    the wire says so). ``None`` sniffs: a body that snappy-decompresses and then parses is
    taken as compressed, anything else as plain. Sniffing is a heuristic (a short plain
    body can also be valid snappy), so a server should prefer explicit configuration.
    Placeholder inputs (empty ArrayProto with DT_INVALID) come back as None.
    """
    if compressed is None:
        try:
            return _decode_torch_plain(_snappy_decompress(buf))
        except CodecError:
            return _decode_torch_plain(buf)
    return _decode_torch_plain(_snappy_decompress(buf) if compressed else buf)


def _decode_torch_plain(buf: Any) -> TorchRequestData:
    raw_inputs, raw_map, filt, debug = decode_torch_request_raw(buf)
    inputs = [
        None if (r.dtype == DT_INVALID and not r.kinds() and r.dims is None) else r.to_tensor(f"input #{i}")
        for i, r in enumerate(raw_inputs)
    ]
    map_inputs = {k: v.to_tensor(f"map input {k!r}") for k, v in raw_map.items()}
    return TorchRequestData(inputs, map_inputs, filt, debug)


def _decode_blade_array(buf: Any, a: int, b: int) -> RawArray:
    out = RawArray("blade")
    for field, wt, x, y in _fields(buf, a, b):
        if field == 1 and wt == 2:
            out.blade_blob_name = _text(buf, x, y)
        elif field == 2 and wt == 2:
            out.name_in_dl_model = _text(buf, x, y)
        elif field == 3 and wt == 0:
            out.batchsize = _int32(x)
        elif field == 4 and wt == 2:
            out.dims = (out.dims or []) + _decode_dims(buf, x, y)
        elif field in _BLADE_FIELD_KINDS:
            _add_values(out, _BLADE_FIELD_KINDS[field], buf, wt, x, y)
    return out


def decode_blade_response(buf: Any) -> list[RawArray]:
    """Parse a Blade ``Response`` into its output Arrays (in wire order)."""
    buf = _as_buffer(buf)
    return [
        _decode_blade_array(buf, x, y)
        for field, wt, x, y in _fields(buf, 0, len(buf))
        if field == 1 and wt == 2
    ]


class BladeRequestData(NamedTuple):
    signature_name: str | None
    inputs: list[BladeTensor]
    output_info: list[tuple[str, int]]


def decode_blade_request(buf: Any) -> BladeRequestData:
    """Server side: parse and validate a Blade ``Request``."""
    buf = _as_buffer(buf)
    sig: str | None = None
    inputs: list[BladeTensor] = []
    infos: list[tuple[str, int]] = []
    for field, wt, x, y in _fields(buf, 0, len(buf)):
        if wt != 2:
            continue
        if field == 1:
            sig = _text(buf, x, y)
        elif field == 2:
            raw = _decode_blade_array(buf, x, y)
            name = raw.name_in_dl_model or raw.blade_blob_name
            t = raw.to_tensor(f"input {name!r}")
            inputs.append(BladeTensor(name, t.array, t.dtype, raw.batchsize, raw.blade_blob_name))
        elif field == 3:
            name, blob, dt = "", "", 0
            for f2, wt2, x2, y2 in _fields(buf, x, y):
                if f2 == 1 and wt2 == 2:
                    blob = _text(buf, x2, y2)
                elif f2 == 2 and wt2 == 2:
                    name = _text(buf, x2, y2)
                elif f2 == 3 and wt2 == 0:
                    dt = x2
            infos.append((name or blob, dt))
    return BladeRequestData(sig, inputs, infos)


__all__ = [
    "BLADE_FIELDS",
    "BLADE_NUMPY_DTYPES",
    "DT_NAMES",
    "FIELDS",
    "NUMPY_DTYPES",
    "TF_FIELDS",
    "TORCH_FIELDS",
    "BladeInput",
    "BladeRequestData",
    "BladeTensor",
    "CodecError",
    "RawArray",
    "TFRequestData",
    "Tensor",
    "TorchRequestData",
    "array_proto",
    "blade_array",
    "check_shape",
    "decode_blade_request",
    "decode_blade_response",
    "decode_tf_request",
    "decode_tf_request_raw",
    "decode_tf_response",
    "decode_torch_request",
    "decode_torch_request_raw",
    "decode_torch_response",
    "decode_varints",
    "dt_for_numpy",
    "encode_blade_request",
    "encode_blade_response",
    "encode_tf_request",
    "encode_tf_response",
    "encode_torch_request",
    "encode_torch_response",
    "encode_varints",
    "map_entry",
    "numpy_dtype",
    "output_info_bytes",
    "to_wire_values",
    "value_field",
    "value_kind",
    "varint",
    "wire_payload",
]
