"""Named values across the process boundary: what an op on worker processes of its own
(``placement: process``) receives and answers, numpy arrays and plain Python values alike.

A message is ``!I`` (the header's length), a JSON header, padding to 8 bytes, then the raw
bytes of every array and every ``bytes`` value, each at an 8-byte aligned offset. The header
holds each value as a tree of JSON: ``None``, booleans, integers, floats and strings as
themselves, lists as lists, and everything JSON cannot tell apart as a one-key object:

* ``{"a": [dtype, shape, offset, nbytes]}``: a numeric numpy array (its bytes in the data);
* ``{"m": [path, dtype, shape, nbytes]}``: a large one in shared memory (gateway.codecs.shm);
* ``{"g": [dtype, offset, nbytes]}``: a numpy scalar (``np.float32(1.5)``);
* ``{"o": [shape, [items]]}``: a numpy array of strings or objects, item by item;
* ``{"b": [offset, nbytes]}``: ``bytes`` (``bytearray`` and ``memoryview`` arrive as bytes);
* ``{"t": [items]}``: a tuple; ``{"d": [[key, value], ...]}``: a dict (keys of any plain type).

Encoding copies each array's bytes once, into the message or into shared memory; decoding
copies nothing: the arrays are read-only views of the message received or of the shared
memory (copy one to change it in place). The header's ``shm`` names the directory where the
answer may put its own large arrays.
Anything else (a set, a user's class) is refused with a TypeError naming the value.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from gateway.codecs.shm import SHM_MIN, ShmWriter, take

CONTENT_TYPE = "application/x-easkit-values"
_LEN = struct.Struct("!I")
_ALIGN = 8
_PAD = bytes(_ALIGN)


class Message(NamedTuple):
    values: dict[str, Any]
    wanted: list[str]  # the names the sender wants back (from the gateway)
    shm: str | None  # where the answer may put its large arrays (from the gateway)


class _Writer:
    def __init__(self, shm: ShmWriter | None) -> None:
        self.parts: list[Any] = []
        self.size = 0  # bytes of data so far (offsets are relative to the data's start)
        self.shm = shm

    def add(self, buf: Any, nbytes: int) -> int:
        offset = self.size
        self.parts.append(buf)
        pad = -nbytes % _ALIGN
        if pad:
            self.parts.append(_PAD[:pad])
        self.size += nbytes + pad
        return offset

    def node(self, value: Any, where: str) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, np.ndarray):
            if value.dtype.kind in "biufc":
                if self.shm is not None and value.nbytes >= SHM_MIN:
                    path = self.shm.put(value)
                    if path is not None:  # else no room there: in the message
                        return {"m": [path, value.dtype.str, list(value.shape), value.nbytes]}
                arr = np.ascontiguousarray(value)
                # A byte view of the array (no copy): the join in encode() is its one copy.
                offset = self.add(arr.reshape(-1).view(np.uint8), arr.nbytes)
                return {"a": [arr.dtype.str, list(arr.shape), offset, arr.nbytes]}
            if value.dtype.kind in "OUS":
                items = [self.node(v, f"{where}[{i}]") for i, v in enumerate(value.ravel().tolist())]
                return {"o": [list(value.shape), items]}
        elif isinstance(value, np.generic) and value.dtype.kind in "biufc":
            raw = value.tobytes()
            return {"g": [value.dtype.str, self.add(raw, len(raw)), len(raw)]}
        elif isinstance(value, (bytes, bytearray, memoryview)):
            view = memoryview(value).cast("B")
            return {"b": [self.add(view, view.nbytes), view.nbytes]}
        elif isinstance(value, list):
            return [self.node(v, f"{where}[{i}]") for i, v in enumerate(value)]
        elif isinstance(value, tuple):
            return {"t": [self.node(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        elif isinstance(value, dict):
            return {"d": [[self.node(k, where), self.node(v, f"{where}[{k!r}]")] for k, v in value.items()]}
        raise TypeError(
            f"{where}: cannot send a {type(value).__name__} to another process "
            "(numpy arrays, None, bool, int, float, str, bytes, and lists, tuples and dicts of them)"
        )


def encode(
    values: Mapping[str, Any],
    wanted: Sequence[str] = (),
    shm: ShmWriter | None = None,
    answer_shm: str | None = None,
) -> bytes:
    """A message of ``values`` (and, from the gateway, the names it wants back, and the
    directory where the answer may put large arrays). ``shm``: put large arrays there."""
    writer = _Writer(shm)
    tree = {name: writer.node(value, name) for name, value in values.items()}
    doc = {"values": tree, "wanted": list(wanted), "shm": answer_shm}
    head = json.dumps(doc, separators=(",", ":")).encode()
    lead = _LEN.size + len(head)
    return b"".join([_LEN.pack(len(head)), head, _PAD[: -lead % _ALIGN], *writer.parts])


def decode(message: bytes, *, shm: str | None = None, unlink: bool = False) -> Message:
    """The values of a message; ValueError on a malformed one, or one whose shared memory is
    gone or outside ``shm`` (the only directory arrays are mapped from; None: none).
    ``unlink``: remove the shared memory files once mapped (the gateway, reading an answer;
    a request's files are the gateway's to remove)."""
    try:
        (n,) = _LEN.unpack_from(message)
        doc = json.loads(message[_LEN.size : _LEN.size + n])
        start = _LEN.size + n
        start += -start % _ALIGN
        reader = _Reader(message, start, shm, unlink)
        values = {str(name): reader.node(node) for name, node in doc["values"].items()}
        shm = doc.get("shm")
        return Message(values, [str(w) for w in doc.get("wanted") or ()], str(shm) if shm else None)
    except (struct.error, json.JSONDecodeError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ValueError(f"not a values message ({type(exc).__name__}: {exc})") from None
    except OSError as exc:
        raise ValueError(f"shared memory of the message is gone ({exc.strerror})") from None


class _Reader:
    def __init__(self, message: bytes, start: int, shm: str | None, unlink: bool) -> None:
        self.message = message
        self.start = start
        self.shm = shm
        self.unlink = unlink

    def _span(self, offset: int, nbytes: int) -> int:
        begin = self.start + int(offset)
        if offset < 0 or nbytes < 0 or begin + nbytes > len(self.message):
            raise ValueError("a value lies outside the message")
        return begin

    def node(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.node(v) for v in node]
        if not isinstance(node, dict):
            return node
        ((tag, body),) = node.items()
        if tag == "a":
            dtype, shape, offset, nbytes = body
            dt = np.dtype(dtype)
            begin = self._span(offset, nbytes)
            return np.frombuffer(self.message, dt, nbytes // dt.itemsize, begin).reshape(shape)
        if tag == "m":
            path, dtype, shape, nbytes = body
            return take(
                str(path), np.dtype(dtype), shape, int(nbytes), directory=self.shm, unlink=self.unlink
            )
        if tag == "g":
            dtype, offset, nbytes = body
            return np.frombuffer(self.message, np.dtype(dtype), 1, self._span(offset, nbytes))[0]
        if tag == "o":
            shape, items = body
            arr = np.empty(len(items), dtype=object)
            for i, item in enumerate(items):  # one by one: a list item stays one element
                arr[i] = self.node(item)
            return arr.reshape(shape)
        if tag == "b":
            offset, nbytes = body
            begin = self._span(offset, nbytes)
            return self.message[begin : begin + nbytes]
        if tag == "t":
            return tuple(self.node(v) for v in body)
        if tag == "d":
            return {self.node(k): self.node(v) for k, v in body}
        raise ValueError(f"unknown value tag {tag!r}")


__all__ = ["CONTENT_TYPE", "Message", "decode", "encode"]
