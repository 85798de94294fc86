"""Protobuf wire primitives of the EAS codec: varints, the field scanner, packed arrays.

Encoders build a message as a list of *pieces* (bytes, or memoryviews of numpy data) with
its size, so a large tensor is copied once, by the final ``b"".join``. Decoders walk a
buffer with :func:`fields`, which yields byte spans instead of copies; one-byte varints
(keys of fields 1-15, short lengths, small values: most of a small message) are read inline.
Malformed wire data raises :class:`CodecError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

Pieces = list[Any]  # bytes | memoryview


class CodecError(ValueError):
    """Malformed or inconsistent wire data (maps to HTTP 400 on a server)."""


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


def tag(field: int, wire_type: int) -> bytes:
    """The key of field ``field`` with ``wire_type`` (0 varint, 1 fixed64, 2 length, 5 fixed32)."""
    key = (field << 3) | wire_type
    return _SMALL_VARINTS[key] if key < 128 else varint(key)


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
    if arr.dtype == np.bool_:  # 0/1: one byte each
        return arr.astype(np.uint8, copy=False).tobytes()
    if arr.size <= 16:
        # A few values (a typical small answer): a Python loop beats numpy's set-up cost.
        return b"".join([varint(v) for v in arr.ravel().tolist()])
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


def raw_bytes(arr: np.ndarray, layout: str) -> memoryview:
    """The flat bytes of ``arr`` in numpy ``layout`` ("<f4", ...): a view when no copy is needed."""
    return memoryview(np.ascontiguousarray(arr, layout).reshape(-1)).cast("B")


# ----------------------------------------------------------------------------- encoding
def len_field(field_tag: bytes, pieces: Pieces, size: int) -> tuple[Pieces, int]:
    """A length-delimited field (``field_tag`` is its key) around a message's pieces."""
    head = field_tag + varint(size)
    return [head, *pieces], len(head) + size


def packed_field(field: int, chunks: Sequence[Any]) -> tuple[Pieces, int]:
    """A packed repeated field from payload chunks; nothing at all when they are empty."""
    size = sum(len(c) for c in chunks)
    if size == 0:
        return [], 0
    head = tag(field, 2) + varint(size)
    return [head, *chunks], len(head) + size


def bytes_field(field: int, items: Iterable[bytes]) -> tuple[Pieces, int]:
    """A repeated bytes field: one key and length per element."""
    key = tag(field, 2)
    out: Pieces = []
    n = 0
    for s in items:
        head = key + varint(len(s))
        out.append(head)
        out.append(s)
        n += len(head) + len(s)
    return out, n


def string_field(field_tag: bytes, s: str | bytes) -> bytes:
    """One length-delimited string (UTF-8) or bytes field."""
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return field_tag + varint(len(b)) + b


def dims_message(dims: Sequence[int]) -> bytes:
    """A ``Shape``/``ArrayShape`` message body: its packed dims (field 1), empty for no dims."""
    payload = b"".join([varint(int(d)) for d in dims])
    if not payload:
        return b""
    return b"\x0a" + varint(len(payload)) + payload


# ----------------------------------------------------------------------------- decoding
def read_varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
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


# (field number, wire type, a, b) as fields() yields them and scan_fields() lists them.
Field = tuple[int, int, int, int]


def fields(buf: Any, pos: int, end: int) -> Iterator[Field]:
    """Yield (field, wire_type, a, b): varint -> (value, 0); LEN/I32/I64 -> byte span [a, b)."""
    # One-byte varints (keys of fields 1-15, lengths < 128, small values) and two-byte
    # lengths are read inline: most of a small message's varints, a function call each saved.
    while pos < end:
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = read_varint(buf, pos, end)
        field, wt = key >> 3, key & 7
        if field == 0:
            raise CodecError("field number 0")
        if wt == 0:
            if pos < end and (value := buf[pos]) < 0x80:
                pos += 1
            else:
                value, pos = read_varint(buf, pos, end)
            yield field, 0, value, 0
        elif wt == 2:
            if pos < end and (n := buf[pos]) < 0x80:
                pos += 1
            elif pos + 1 < end and buf[pos + 1] < 0x80:  # two bytes: up to 16 KiB, a small tensor's
                n = (n & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                n, pos = read_varint(buf, pos, end)
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


def signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def text(buf: Any, a: int, b: int) -> str:
    try:
        return bytes(buf[a:b]).decode("utf-8")
    except UnicodeDecodeError:
        raise CodecError("invalid UTF-8 in a string field") from None


def scan_fields(buf: Any, start: int = 0, end: int | None = None) -> list[Field] | None:
    """The fields of ``buf[start:end]`` as :func:`fields` yields them, or None when malformed."""
    try:
        return list(fields(buf, start, len(buf) if end is None else end))
    except CodecError:
        return None


def as_buffer(buf: Any) -> Any:
    """``buf`` as something indexable by byte (bytes, bytearray or a flat byte memoryview)."""
    if isinstance(buf, (bytes, bytearray)):
        return buf
    if isinstance(buf, memoryview):
        return buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf
    if isinstance(buf, str):
        raise TypeError("expected bytes, got str")
    return memoryview(buf).cast("B")


# Snappy cannot expand more than ~21x: refuse bigger claims before allocating.
_SNAPPY_MAX_RATIO = 24


def snappy_decompress(buf: Any, max_size: int | None = None) -> bytes:
    """Inflate a raw-snappy block (``TorchRequest(flag=True)`` bodies); CodecError if it is not one.

    The block starts with its uncompressed length, checked against what the input could
    produce (and against ``max_size``) before anything is allocated.
    """
    import cramjam  # local: only snappy bodies need it (an optional dependency)

    data = bytes(buf)
    claimed, _ = read_varint(data, 0, min(len(data), 10))
    if claimed > _SNAPPY_MAX_RATIO * len(data) + 64 or (max_size is not None and claimed > max_size):
        raise CodecError("snappy body claims an impossible uncompressed size")
    try:
        return bytes(cramjam.snappy.decompress_raw(data))
    except Exception as exc:
        raise CodecError(f"invalid snappy body: {exc}") from None
