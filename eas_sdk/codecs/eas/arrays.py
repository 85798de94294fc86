"""Encoding of TF/Torch ``ArrayProto`` messages and the ``map<string, ArrayProto>`` entries.

Requests validate and snapshot what the caller gave (lists, ndarrays, :class:`Tensor`);
responses are written from numpy memory (float/double values are copied once, by the
final join) with the dtype and shape fields of a model's few output shapes built once.
Output is byte-identical to protobuf's own serialisation (fields in number order, packed).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from .dtypes import FIELDS, Kind, dt_for_numpy, value_kind
from .values import check_shape, response_strings, to_wire_values, wire_payload
from .wire import Pieces, bytes_field, dims_message, encode_varints, packed_field, tag, varint


class Tensor(NamedTuple):
    """A shaped ndarray and its EAS DT code."""

    array: np.ndarray
    dtype: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)


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
        shape = dims_message(dims)
        head = b"\x12" + varint(len(shape))
        pieces += [head, shape]
        size += len(head) + len(shape)
    for field in sorted(fields):
        chunks = fields[field]
        p, n = bytes_field(field, chunks) if kinds.get(field) == Kind.BYTES else packed_field(field, chunks)
        pieces += p
        size += n
    return pieces, size


def request_array(value: Any, family: str, what: str, copy: bool = True) -> tuple[Pieces, int]:
    """Pieces and size of the ArrayProto of a request input (ndarray, Tensor or nested list).

    The DT code is inferred from the numpy dtype unless a Tensor names it; the values are
    validated and copied, so the caller may reuse its array afterwards (``copy=False``: float
    and double payloads stay views of the array, for a caller that joins the pieces at once).
    """
    if isinstance(value, Tensor):
        arr, dt = np.asarray(value.array), value.dtype
    else:
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        dt = dt_for_numpy(arr.dtype, family)
    kind = value_kind(dt, family)
    dims = check_shape(arr.shape, what)
    payload = wire_payload(to_wire_values(arr, kind, what), kind, copy)
    chunks = payload if isinstance(payload, list) else [payload]
    return array_proto(dt, dims, {FIELDS[family][kind]: chunks}, {FIELDS[family][Kind.BYTES]: Kind.BYTES})


@functools.lru_cache(maxsize=256)
def _response_plan(dtype: np.dtype[Any], family: str) -> tuple[int, str, int, bytes]:
    # (DT code, value kind, field, the field's key as packed) a family answers a numpy dtype
    # with: looked up once.
    dt = dt_for_numpy(dtype, family, response=True)
    kind = value_kind(dt, family)
    field = FIELDS[family][kind]
    return dt, kind, field, tag(field, 2)


@functools.lru_cache(maxsize=1024)
def _array_head(dt: int, shape: tuple[int, ...]) -> bytes:
    # dtype and shape fields: the same few for every answer of a model, so built once.
    dims = dims_message(shape)
    return b"\x08" + varint(dt) + b"\x12" + varint(len(dims)) + dims


# Native dtypes whose bytes already are the packed payload of a value kind.
_FIXED_KINDS = {np.dtype("<f4"): Kind.FLOAT, np.dtype("<f8"): Kind.DOUBLE, np.dtype(np.bool_): Kind.BOOL}


def response_payload(arr: np.ndarray, kind: str, what: str, checked: bool) -> Any:
    """Packed payload of an answer's numeric values: fixed-size values and bools as a view of
    the array, a few varints by a Python loop (cheaper than numpy's set-up), else vectorised.

    ``checked``: the kind was chosen for the array's dtype, so its values fit the field
    (uint64 aside, which is range-checked like any value given with an explicit DT code).
    """
    if _FIXED_KINDS.get(arr.dtype) == kind:
        view = memoryview(arr)
        if view.c_contiguous and view.nbytes:
            return view.cast("B")  # the array's own bytes, in order already
        return memoryview(np.ascontiguousarray(arr).reshape(-1)).cast("B")
    if checked and kind in (Kind.INT32, Kind.INT64) and arr.dtype.kind in "iub" and arr.dtype != np.uint64:
        if arr.size <= 16:
            return b"".join([varint(v) for v in arr.ravel().tolist()])
        return encode_varints(arr)
    return wire_payload(to_wire_values(arr, kind, what), kind, copy=False)


def response_array(value: Any, family: str, what: str) -> tuple[Pieces, int]:
    """Pieces and size of the ArrayProto answering ``value`` (an ndarray, Tensor or list).

    The DT code is one eas-prediction 0.36 can read back (see ``dt_for_numpy``); strings
    may be str or bytes. Float/double values stay views of the array until the join.
    """
    checked = not isinstance(value, Tensor)
    if not checked:
        arr, dt = np.asarray(value.array), value.dtype
        kind = value_kind(dt, family)
        field = FIELDS[family][kind]
        lead_key = tag(field, 2)
    else:
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        dt, kind, field, lead_key = _response_plan(arr.dtype, family)
    head = _array_head(dt, arr.shape)
    if kind == Kind.BYTES:
        p, n = bytes_field(field, response_strings(arr))
        return [head, *p], len(head) + n
    payload = response_payload(arr, kind, what, checked)
    size = len(payload)
    if not size:  # protobuf writes no empty packed field
        return [head], len(head)
    lead = lead_key + varint(size)
    return [head, lead, payload], len(head) + len(lead) + size


@functools.lru_cache(maxsize=1024)
def _key_field(key: str) -> bytes:
    kb = key.encode("utf-8")
    return b"\x0a" + varint(len(kb)) + kb


def map_entry(field_tag: bytes, key: str, value_pieces: Pieces, value_size: int) -> tuple[Pieces, int]:
    """Pieces of one ``map<string, Message>`` entry (key and value are always written)."""
    key_field = _key_field(key)
    value_head = b"\x12" + varint(value_size)
    entry_size = len(key_field) + len(value_head) + value_size
    head = field_tag + varint(entry_size)
    return [head, key_field, value_head, *value_pieces], len(head) + entry_size


def named_items(values: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Iterable[tuple[str, Any]]:
    """(name, value) pairs of a mapping or of an iterable of pairs."""
    items = getattr(values, "items", None)  # cheaper than an isinstance check against the ABC
    return items() if items is not None else values  # type: ignore[no-any-return]
