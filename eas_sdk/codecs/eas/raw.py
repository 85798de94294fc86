"""Decoding of TF/Torch ``ArrayProto`` and Blade ``Array`` messages into :class:`RawArray`.

Decoders follow protobuf's parsing rules (unknown fields skipped, unpacked and split
packed fields concatenated) and return ``np.frombuffer`` views of packed payloads: zero
copy for float/double layouts (the views are read-only and may be unaligned; ``.copy()``
to own or align them); varint fields are decoded vectorised. The shape is checked against
the value count only in :meth:`RawArray.to_tensor`; a missing shape means a flat vector.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .arrays import Tensor
from .dtypes import (
    BLADE_DT_FLOAT,
    BLADE_DT_UNKNOWN,
    BLADE_NUMPY_DTYPES,
    DT_NAMES,
    FIELD_KINDS,
    NUMPY_DTYPES,
    Kind,
    value_kind,
)
from .wire import CodecError, decode_varints, fields, int32, read_varint, signed64, text

_WIRE_NP = {Kind.FLOAT: np.dtype("<f4"), Kind.DOUBLE: np.dtype("<f8")}


def numeric_piece(buf: Any, kind: str, wt: int, a: int, b: int) -> np.ndarray:
    """Values of one occurrence of a numeric field, packed (wt 2) or not."""
    if wt == 2 and a == b:
        return EMPTY_VALUES[kind]
    if kind in _WIRE_NP:
        dt = _WIRE_NP[kind]
        want = 5 if kind == Kind.FLOAT else 1
        if wt == 2:
            if (b - a) % dt.itemsize:
                raise CodecError(f"packed {kind} field length {b - a} is not a multiple of {dt.itemsize}")
            # Positional arguments: numpy reads keywords at twice the cost of the view itself.
            return np.frombuffer(buf, dt, (b - a) // dt.itemsize, a)
        if wt != want:
            raise CodecError(f"wrong wire type {wt} for a {kind} field")
        return np.frombuffer(buf, dt, 1, a)
    if wt == 2:
        raw = decode_varints(np.frombuffer(buf, dtype=np.uint8, count=b - a, offset=a))
    elif wt == 0:
        raw = np.array([a], dtype=np.uint64)
    else:
        raise CodecError(f"wrong wire type {wt} for a {kind} field")
    if kind == Kind.INT32:
        return raw.astype(np.uint32).view(np.int32)
    if kind == Kind.INT64:
        return raw.view(np.int64)
    return raw != 0  # bool


EMPTY_VALUES = {
    Kind.FLOAT: np.empty(0, dtype="<f4"),
    Kind.DOUBLE: np.empty(0, dtype="<f8"),
    Kind.INT32: np.empty(0, dtype=np.int32),
    Kind.INT64: np.empty(0, dtype=np.int64),
    Kind.BOOL: np.empty(0, dtype=np.bool_),
}
for _v in EMPTY_VALUES.values():
    _v.flags.writeable = False


class RawArray:
    """One decoded TF/Torch ArrayProto or Blade Array, as on the wire.

    ``dims`` is None when the message had no shape; ``values(kind)`` is the flat array of a
    value field (read-only views where possible) or ``list[bytes]`` for strings.
    """

    __slots__ = (
        "_values",
        "batchsize",
        "blade_blob_name",
        "dims",
        "dtype",
        "family",
        "name_in_dl_model",
    )

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
        if kind == Kind.BYTES:
            return [s for p in parts for s in p] if parts else []
        if not parts:
            return EMPTY_VALUES[kind]
        if len(parts) == 1:
            return parts[0]  # type: ignore[no-any-return]
        return np.concatenate(parts)

    def shape(self) -> list[int]:
        return list(self.dims) if self.dims else []

    def blade_dtype(self) -> int:
        for kind, dt in ((Kind.FLOAT, 1), (Kind.INT32, 2), (Kind.INT64, 3), (Kind.BYTES, 4)):
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
            held = self._values
            others = [] if len(held) == 1 and kind in held else [k for k in self.kinds() if k != kind]
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
            if dims and min(dims) < 0:
                raise CodecError(f"{what}: negative dimension in shape {dims}")
            if math.prod(dims) != n:
                raise CodecError(f"{what}: shape {dims} needs {math.prod(dims)} values, got {n}")
        if kind == Kind.BYTES:
            arr = np.empty(n, dtype=object)
            arr[:] = vals
        else:
            assert isinstance(vals, np.ndarray)
            arr = vals
            if arr.dtype is not target and arr.dtype != target:
                if target.kind in "iu":
                    info = np.iinfo(target)
                    if arr.size and (int(arr.min()) < info.min or int(arr.max()) > info.max):
                        raise CodecError(f"{what}: value out of range for {DT_NAMES.get(dt, dt)}")
                arr = arr.astype(target)
        return Tensor(arr.reshape(dims), dt)


def add_values(out: RawArray, kind: str, buf: Any, wt: int, x: int, y: int) -> None:
    """Append one occurrence of a value field (TF/Torch ArrayProto or Blade Array) to ``out``."""
    if kind == Kind.BYTES:
        if wt != 2:
            raise CodecError("string_val must be length-delimited")
        out._values.setdefault(kind, []).append([bytes(buf[x:y])])
    else:
        out._values.setdefault(kind, []).append(numeric_piece(buf, kind, wt, x, y))


def decode_array_proto(buf: Any, a: int, b: int, family: str) -> RawArray:
    kinds = FIELD_KINDS[family]
    out = RawArray(family)
    for field, wt, x, y in fields(buf, a, b):
        if field == 1 and wt == 0:
            out.dtype = int32(x)
        elif field == 2 and wt == 2:
            dims = [] if out.dims is None else out.dims
            dims += decode_dims(buf, x, y)
            out.dims = dims
        elif field in kinds:
            add_values(out, kinds[field], buf, wt, x, y)
        # unknown fields are skipped, as protobuf does
    return out


def decode_dims(buf: Any, a: int, b: int) -> list[int]:
    dims: list[int] = []
    for field, wt, x, y in fields(buf, a, b):
        if field != 1:
            continue
        if wt == 2 and y - x <= 32:
            pos = x  # a handful of dims: a Python loop beats numpy's set-up cost
            while pos < y:
                v = buf[pos]
                if v < 0x80:  # a dimension under 128: one byte, read here
                    pos += 1
                    dims.append(v)
                else:
                    v, pos = read_varint(buf, pos, y)
                    dims.append(signed64(v))
        elif wt == 2:
            packed = np.frombuffer(buf, dtype=np.uint8, count=y - x, offset=x)
            dims += decode_varints(packed).view(np.int64).tolist()
        elif wt == 0:
            dims.append(signed64(x))
        else:
            raise CodecError("shape dims must be varints")
    return dims


def decode_map_entry(buf: Any, a: int, b: int, family: str) -> tuple[str, RawArray]:
    key = ""
    value: RawArray | None = None
    for field, wt, x, y in fields(buf, a, b):
        if field == 1 and wt == 2:
            key = text(buf, x, y)
        elif field == 2 and wt == 2:
            value = decode_array_proto(buf, x, y, family)
    return key, value if value is not None else RawArray(family)
