"""Dtype tables of the EAS tensor protocols and the numpy mapping.

``DT_*`` are TF/Torch ``ArrayDataType`` codes, ``BLADE_DT_*`` Blade ``DataType`` codes.
A value travels in one of a few *kinds* (``KIND_*``: packed float, double, int32, int64,
bool, or repeated bytes); ``TF_FIELDS``/``TORCH_FIELDS``/``BLADE_FIELDS`` (``FIELDS[family]``)
give each kind's field number in an ArrayProto (TF, Torch) or Array (Blade).
"""

from __future__ import annotations

from typing import Any

import numpy as np

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

# Blade's own DataType codes (not the TF/Torch ones).
BLADE_DT_UNKNOWN, BLADE_DT_FLOAT, BLADE_DT_INT32, BLADE_DT_INT64, BLADE_DT_STRING = range(5)
BLADE_DT_NAMES: dict[int, str] = {
    0: "DT_UNKNOWN",
    1: "DT_FLOAT",
    2: "DT_INT32",
    3: "DT_INT64",
    4: "DT_STRING",
}


# Value kinds: how a value travels on the wire.
class Kind:
    """The value kinds, as one namespace (also exported one by one as ``KIND_*``)."""

    FLOAT = "float"  # packed fixed32, '<f4'
    DOUBLE = "double"  # packed fixed64, '<f8'
    INT32 = "int32"  # packed varint, negative => 10-byte sign-extended varint
    INT64 = "int64"  # packed varint
    BOOL = "bool"  # packed varint 0/1
    BYTES = "bytes"  # repeated length-delimited, one tag per element


KIND_FLOAT, KIND_DOUBLE, KIND_INT32 = Kind.FLOAT, Kind.DOUBLE, Kind.INT32
KIND_INT64, KIND_BOOL, KIND_BYTES = Kind.INT64, Kind.BOOL, Kind.BYTES

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
FLT_MAX = float(np.finfo(np.float32).max)

# Field number -> value kind, for decoding.
TF_FIELD_KINDS = {v: k for k, v in TF_FIELDS.items()}
TORCH_FIELD_KINDS = {v: k for k, v in TORCH_FIELDS.items()}
BLADE_FIELD_KINDS = {v: k for k, v in BLADE_FIELDS.items()}
FIELD_KINDS = {"tf": TF_FIELD_KINDS, "torch": TORCH_FIELD_KINDS, "blade": BLADE_FIELD_KINDS}


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

    ``response=True`` chooses what eas-prediction 0.36 can read back: uint8/uint16 become
    DT_INT32 (its TFResponse returns None for UINT8/UINT16), and for Torch bool does too (its
    ArrayProto has no bool field). float16 widens to DT_FLOAT, uint32 to DT_INT64.
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
        return DT_INT32 if (family == "torch" and response) else DT_BOOL
    if k == "i":
        return {1: DT_INT8, 2: DT_INT16, 4: DT_INT32, 8: DT_INT64}[dt.itemsize]
    if k == "u":
        if dt.itemsize == 1:
            return DT_INT32 if response else DT_UINT8
        if dt.itemsize == 2:
            return DT_INT32 if response else DT_UINT16
        return DT_INT64
    if k in "SOU":
        return DT_STRING
    raise TypeError(f"no EAS dtype for numpy {dt}")
