"""The Blade ``Request``/``Response`` (proto2, package ``blade``).

Request: tf_signature_name (1), inputs (2, repeated Array), output_info (3, repeated
OutputInfo). Response: outputs (1, repeated Array). An Array carries both names, a
required batchsize and a shape; it has no dtype: the value field used tells it (an empty
Blade tensor decodes as float32). There is no double field: doubles travel as float.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from .arrays import response_payload
from .dtypes import BLADE_FIELD_KINDS, BLADE_FIELDS, Kind, dt_for_numpy, value_kind
from .raw import RawArray, add_values, decode_dims
from .values import check_shape, response_strings, to_wire_values, wire_payload
from .wire import (
    Pieces,
    as_buffer,
    bytes_field,
    dims_message,
    fields,
    int32,
    len_field,
    packed_field,
    string_field,
    tag,
    text,
    varint,
)


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


def blade_array(
    name: str,
    batchsize: int,
    dims: Sequence[int] | None,
    fields: Mapping[int, Sequence[Any]],
    blob_name: str | None = None,
) -> tuple[Pieces, int]:
    """Pieces and size of a Blade ``Array`` (proto2: names and batchsize always present)."""
    head = (
        string_field(b"\x0a", name if blob_name is None else blob_name)
        + string_field(b"\x12", name)
        + b"\x18"
        + varint(int(batchsize))
    )
    pieces: Pieces = [head]
    size = len(head)
    if dims is not None:
        shape = dims_message(dims)
        sh = b"\x22" + varint(len(shape)) + shape
        pieces.append(sh)
        size += len(sh)
    for field in sorted(fields):
        chunks = fields[field]
        is_bytes = BLADE_FIELD_KINDS.get(field) == Kind.BYTES
        p, n = bytes_field(field, chunks) if is_bytes else packed_field(field, chunks)
        pieces += p
        size += n
    return pieces, size


def _blade_value(item: BladeInput | tuple[str, Any], what_prefix: str, response: bool) -> tuple[Pieces, int]:
    """One Array; a response takes str (or any) string values and keeps floats as views."""
    if not isinstance(item, BladeInput):
        item = BladeInput(*item)
    what = f"{what_prefix} {item.name!r}"
    arr = item.array if isinstance(item.array, np.ndarray) else np.asarray(item.array)
    if arr.dtype.kind == "U":
        arr = np.char.encode(arr, "utf-8")
    dt = item.dtype if item.dtype is not None else dt_for_numpy(arr.dtype, "blade")
    kind = value_kind(dt, "blade")
    if kind == Kind.FLOAT and arr.dtype.kind == "f" and arr.dtype.itemsize > 4:
        with np.errstate(over="ignore"):  # beyond float32: inf, as protobuf writes it
            arr = arr.astype(np.float32)  # Blade has no double field
    dims = check_shape(arr.shape, what)
    batch = item.batchsize if item.batchsize is not None else (dims[0] if dims and dims[0] > 0 else 1)
    if response and kind == Kind.BYTES:
        payload: Any = response_strings(arr)
    else:
        payload = wire_payload(to_wire_values(arr, kind, what), kind, copy=not response)
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
        pieces.append(string_field(b"\x0a", signature_name))
    for item in inputs:
        vp, vs = _blade_value(item, "input", response=False)
        pieces += len_field(b"\x12", vp, vs)[0]
    for name, dt in output_info:
        pieces.append(b"\x1a" + varint(len(oi := output_info_bytes(name, dt))) + oi)
    return b"".join(pieces)


def output_info_bytes(name: str, dt: int) -> bytes:
    """A Blade ``OutputInfo`` message body (both names set to ``name``)."""
    return string_field(b"\x0a", name) + string_field(b"\x12", name) + b"\x18" + varint(int(dt))


@functools.lru_cache(maxsize=256)
def _answer_plan(dtype: np.dtype[Any]) -> tuple[str, int]:
    # (value kind, field) Blade answers a numpy dtype with: looked up once.
    kind = value_kind(dt_for_numpy(dtype, "blade"), "blade")
    return kind, BLADE_FIELDS[kind]


@functools.lru_cache(maxsize=1024)
def _answer_head(name: str, batch: int, shape: tuple[int, ...]) -> bytes:
    # Names, batchsize and shape: the same few for every answer of a model, so built once.
    dims = dims_message(shape)
    names = string_field(b"\x0a", name) + string_field(b"\x12", name)
    return names + b"\x18" + varint(batch) + b"\x22" + varint(len(dims)) + dims


def _answer(item: BladeInput | tuple[str, Any]) -> tuple[Pieces, int]:
    """One output Array: arrays that need no conversion (float32, integers, strings) go
    straight from numpy memory; anything else (a given dtype, doubles, str arrays) through
    the checked path."""
    if not isinstance(item, BladeInput):
        item = BladeInput(*item)
    arr = item.array if isinstance(item.array, np.ndarray) else np.asarray(item.array)
    if item.dtype is not None or not (arr.dtype.kind in "iubOS" or arr.dtype == np.float32):
        return _blade_value(item, "output", response=True)
    shape = arr.shape
    batch = item.batchsize if item.batchsize is not None else (shape[0] if shape and shape[0] > 0 else 1)
    head = _answer_head(item.name, batch, shape)
    kind, field = _answer_plan(arr.dtype)
    if kind == Kind.BYTES:
        p, n = bytes_field(field, response_strings(arr))
        return [head, *p], len(head) + n
    payload = response_payload(arr, kind, f"output {item.name!r}", checked=True)
    if not len(payload):  # protobuf writes no empty packed field
        return [head], len(head)
    lead = tag(field, 2) + varint(len(payload))
    return [head, lead, payload], len(head) + len(lead) + len(payload)


def encode_blade_response(outputs: Mapping[str, Any] | Sequence[BladeInput]) -> bytes:
    """Serialize a Blade ``Response``; batchsize defaults to shape[0] (proto2 requires it)."""
    items = [BladeInput(k, v) for k, v in outputs.items()] if isinstance(outputs, Mapping) else outputs
    pieces: Pieces = []
    for item in items:
        pieces += len_field(b"\x0a", *_answer(item))[0]
    return b"".join(pieces)


def _decode_blade_array(buf: Any, a: int, b: int) -> RawArray:
    out = RawArray("blade")
    for field, wt, x, y in fields(buf, a, b):
        if field == 1 and wt == 2:
            out.blade_blob_name = text(buf, x, y)
        elif field == 2 and wt == 2:
            out.name_in_dl_model = text(buf, x, y)
        elif field == 3 and wt == 0:
            out.batchsize = int32(x)
        elif field == 4 and wt == 2:
            out.dims = (out.dims or []) + decode_dims(buf, x, y)
        elif field in BLADE_FIELD_KINDS:
            add_values(out, BLADE_FIELD_KINDS[field], buf, wt, x, y)
    return out


def decode_blade_response(buf: Any) -> list[RawArray]:
    """Parse a Blade ``Response`` into its output Arrays (in wire order)."""
    buf = as_buffer(buf)
    return [
        _decode_blade_array(buf, x, y)
        for field, wt, x, y in fields(buf, 0, len(buf))
        if field == 1 and wt == 2
    ]


class BladeRequestData(NamedTuple):
    signature_name: str | None
    inputs: list[BladeTensor]
    output_info: list[tuple[str, int]]


def _output_info(buf: Any, a: int, b: int) -> tuple[str, int]:
    """(name, data_type) of one OutputInfo: name_in_dl_model, else blade_blob_name."""
    name, blob, dt = "", "", 0
    for field, wt, x, y in fields(buf, a, b):
        if field == 1 and wt == 2:
            blob = text(buf, x, y)
        elif field == 2 and wt == 2:
            name = text(buf, x, y)
        elif field == 3 and wt == 0:
            dt = x
    return name or blob, dt


def decode_blade_request_raw(buf: Any) -> tuple[str | None, list[RawArray], list[tuple[str, int]]]:
    """Parse a Blade ``Request`` without validating tensors: (signature or None, input Arrays,
    output_info as (name_in_dl_model or blade_blob_name, data_type))."""
    buf = as_buffer(buf)
    sig: str | None = None
    arrays: list[RawArray] = []
    infos: list[tuple[str, int]] = []
    for field, wt, x, y in fields(buf, 0, len(buf)):
        if field == 1 and wt == 2:
            sig = text(buf, x, y)
        elif field == 2 and wt == 2:
            arrays.append(_decode_blade_array(buf, x, y))
        elif field == 3 and wt == 2:
            infos.append(_output_info(buf, x, y))
    return sig, arrays, infos


def decode_blade_request(buf: Any) -> BladeRequestData:
    """Server side: parse and validate a Blade ``Request``."""
    sig, arrays, infos = decode_blade_request_raw(buf)
    inputs: list[BladeTensor] = []
    for raw in arrays:
        name = raw.name_in_dl_model or raw.blade_blob_name
        t = raw.to_tensor(f"input {name!r}")
        inputs.append(BladeTensor(name, t.array, t.dtype, raw.batchsize, raw.blade_blob_name))
    return BladeRequestData(sig, inputs, infos)
