"""JSON answers that hold tensors: their size known before they are built, and built without
a Python object per element.

An answer's size can follow from a client's shape (a sparse tensor's declared shape, a model
input that names dimensions): a few bytes of request can ask for gigabytes of answer. Every
adapter that writes tensors into a JSON answer (Cluster Serving, KServe V1 and V2, Paddle
Serving) builds it with :func:`dumps`, which takes a document of plain values and numpy arrays:

* before anything is encoded, the answer's size is estimated: each array from an even sample
  of its elements, encoded (their mean length times the count, plus brackets and commas),
  everything else as it is; past the limit :class:`AnswerTooLarge` says how large the answer
  would be, and nothing is built;
* otherwise arrays are encoded a block of elements at a time, by orjson straight from the
  array's memory (``OPT_SERIALIZE_NUMPY``): no Python object per element. Should the answer
  pass the limit anyway (a sample that missed the long values), the encoding stops there, so
  what is held never exceeds the limit by more than one block;
* arrays of strings hold Python objects already; they are written block by block too.

Numbers are written as the gateway has always written them: float16 and float32 values as
the float64 they equal (``0.10000000149011612``; ``floats="shortest"``: ``0.1``), NaN and
infinities as ``null``, integers and booleans as JSON integers and booleans.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

try:  # orjson is part of the gateway extra; the stdlib is the fallback
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only without the extra
    _orjson = None  # type: ignore[assignment]

# Elements encoded at once: at most a couple of megabytes of text, whatever the dtype.
BLOCK = 1 << 16
# Elements encoded to estimate an array's text (spread evenly over the array).
SAMPLE = 2048
# An answer whose arrays hold at most this many numbers in all (a few hundred kilobytes of
# text at most) is encoded in one call, its size read off the result: estimating and writing
# it piece by piece would cost more than the encoding (a typical answer of a few outputs).
SMALL = 4096
SETTING = "gateway.max_response_bytes"
_MIB = 1 << 20


class AnswerTooLarge(ValueError):
    """An answer over the response limit; the message gives its size, the limit and the
    setting. Every adapter answers it with 413 in its own protocol's error shape."""

    status = 413
    code = "ResponseTooLarge"

    def __init__(self, size: int, limit: int, qualifier: str = "", message: str = "") -> None:
        self.size = size
        self.limit = limit
        text = f"{qualifier} {size}" if qualifier else str(size)
        super().__init__(
            message
            or f"the answer would be {text} bytes ({size / _MIB:.1f} MiB), over the limit of {limit} "
            f"bytes ({limit / _MIB:.1f} MiB) set by {SETTING}"
        )


def check(size: int, limit: int, qualifier: str = "") -> None:
    """Raise AnswerTooLarge when ``size`` passes ``limit`` (0: no limit)."""
    if limit and size > limit:
        raise AnswerTooLarge(size, limit, qualifier)


def raw_size(arr: np.ndarray) -> int:
    """Bytes of ``arr`` in a binary answer: its elements back to back; a string element as
    its UTF-8 bytes after a 4-byte length (V2's BYTES form)."""
    if arr.dtype.kind not in "OSU":
        return int(arr.size) * arr.dtype.itemsize
    return sum(4 + len(v.encode() if isinstance(v, str) else bytes(v)) for v in arr.reshape(-1).tolist())


def raw_total(arrays: Iterable[np.ndarray]) -> int:
    """The summed :func:`raw_size` of ``arrays`` (numbers without a call each: every call's
    answer is measured)."""
    total = 0
    for arr in arrays:
        if arr.dtype.kind in "OSU":
            total += raw_size(arr)
        else:
            total += arr.size * arr.dtype.itemsize
    return total


# The dtypes a processor's JSON-form answer may name (never any numpy type string).
_WIRE_DTYPES = frozenset(
    "float16 float32 float64 int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool".split()
)
_STRING_DTYPES = frozenset(("string", "bytes", "BYTES"))


def processor_outputs(reply: bytes, max_values: int = 0) -> dict[str, np.ndarray]:
    """The arrays of a processor's JSON-form answer, ``{"outputs": {name: {"dtype", "shape",
    "data"}}}``, as user code may give it instead of the TF form the gateway asked for.
    Parsing makes a Python object of every value: an answer of more than ``max_values``
    values (counted before parsing; 0: no limit) raises AnswerTooLarge. ValueError or
    TypeError: not such an answer."""
    if max_values and reply.count(b",") >= max_values:
        raise AnswerTooLarge(
            len(reply),
            max_values,
            message=f"the service's JSON answer holds more than {max_values} values, the most the "
            "gateway parses at once (gateway.max_json_values)",
        )
    doc = _orjson.loads(reply) if _orjson is not None else json.loads(reply)
    outputs = doc.get("outputs") if isinstance(doc, dict) else None
    if not isinstance(outputs, dict):
        raise ValueError("the answer has no 'outputs' object")
    arrays: dict[str, np.ndarray] = {}
    for name, t in outputs.items():
        if not isinstance(t, dict):
            raise ValueError(f"output {name!r}: expected an object with dtype, shape and data")
        dtype, data = t.get("dtype", "float32"), t.get("data", [])
        if dtype in _STRING_DTYPES:
            arr = np.array(data, dtype=object)  # Python strings, never fixed-width unicode
        elif dtype in _WIRE_DTYPES:
            arr = np.asarray(data, dtype=np.dtype(dtype))
        else:
            raise ValueError(f"output {name!r}: unknown dtype {str(dtype)[:32]!r}")
        arrays[str(name)] = arr.reshape(t["shape"]) if "shape" in t else arr
    return arrays


# --- encoding one block --------------------------------------------------------------------


def _text_of(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _plain(value: Any) -> bytes:
    """A value that is no array (a name, a number, a small list) as JSON."""
    if isinstance(value, bytes):
        value = _text_of(value)
    if _orjson is not None:
        return _orjson.dumps(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _numeric(arr: np.ndarray, floats: str) -> np.ndarray:
    """A numeric array as the encoder takes it: floats widened to the text they are written
    in, native byte order, contiguous."""
    if arr.dtype.kind == "f" and (floats == "float64" or arr.dtype.itemsize < 4):
        # float64 text, as Python writes the float64 a float32 equals (the gateway's answers
        # always had it so); float16 has no shortest form of its own in every encoder.
        arr = arr.astype(np.float64 if floats == "float64" else np.float32)
    elif arr.dtype.kind == "c":
        raise TypeError(f"no JSON form for {arr.dtype}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return np.ascontiguousarray(arr)


def _block(arr: np.ndarray, floats: str) -> bytes:
    """A small array (up to BLOCK elements) as nested JSON lists."""
    if arr.dtype.kind in "OSU":
        texts = np.vectorize(_text_of, otypes=[object])(arr) if arr.size else arr.astype(object)
        return _plain(texts.tolist())
    arr = _numeric(arr, floats)
    if _orjson is not None:
        return _orjson.dumps(arr, option=_orjson.OPT_SERIALIZE_NUMPY)
    text = json.dumps(arr.tolist(), separators=(",", ":"))
    if arr.dtype.kind == "f":  # JSON has no NaN or Infinity: null, as orjson writes them
        text = text.replace("-Infinity", "null").replace("Infinity", "null").replace("NaN", "null")
    return text.encode()


_LEAVES = (str, int, float, bool, type(None))


def _prepared(doc: Any, floats: str, room: list[int]) -> Any:
    """``doc`` with its arrays ready for one orjson call, written as :func:`dumps` writes
    them; raises _NotSmall past ``room[0]`` numbers in all, or on an array of strings."""
    kind = type(doc)
    if kind in _LEAVES:
        return doc
    if kind is dict:
        return {str(k): _prepared(v, floats, room) for k, v in doc.items()}
    if kind is list or kind is tuple:
        return [_prepared(v, floats, room) for v in doc]
    if isinstance(doc, (np.ndarray, np.generic)):
        arr = np.asarray(doc)
        room[0] -= arr.size
        if room[0] < 0 or arr.dtype.kind in "OSUVc":
            raise _NotSmall
        if floats == "float64":
            # Python's own numbers: a float32 becomes the float64 it equals, as written above.
            return arr.tolist()
        if arr.ndim == 0:  # a numpy scalar, which orjson writes in its own dtype's shortest form
            return _numeric(arr.reshape(1), floats)[0]
        return _numeric(arr, floats)
    if isinstance(doc, bytes):
        return _text_of(doc)
    if isinstance(doc, Mapping):
        return {str(k): _prepared(v, floats, room) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_prepared(v, floats, room) for v in doc]
    return doc


class _NotSmall(Exception):
    pass


def small(doc: Any, floats: str = "float64") -> bytes | None:
    """``doc`` encoded in one call when it is small (see SMALL), as :func:`dumps` writes it;
    None when it is not small (then estimate it, or let :func:`dumps` bound it)."""
    if _orjson is None:
        return None
    try:
        ready = _prepared(doc, floats, [SMALL])
    except _NotSmall:
        return None
    return _orjson.dumps(ready, option=_orjson.OPT_SERIALIZE_NUMPY)


def small_with(
    doc: dict[str, Any], arrays: list[tuple[dict[str, Any], str]], floats: str = "float64"
) -> bytes | None:
    """:func:`small` for a document whose only arrays sit at known places, each
    ``(holder, key)`` with ``holder[key]`` an array, the rest plain JSON values (a V2
    answer's outputs): only the arrays are converted, the rest goes to the encoder as it is,
    instead of walking the whole document. None when it is not small; then the arrays are
    left in place for :func:`estimate` and :func:`dumps`."""
    if _orjson is None:
        return None
    room = SMALL
    for holder, key in arrays:
        arr = holder[key]
        room -= arr.size
        if room < 0 or arr.dtype.kind in "OSUVc":
            return None
    for holder, key in arrays:
        arr = holder[key]
        holder[key] = arr.tolist() if floats == "float64" else _numeric(arr, floats)
    return _orjson.dumps(doc, option=_orjson.OPT_SERIALIZE_NUMPY)


# --- estimating ----------------------------------------------------------------------------


def _lists(shape: tuple[int, ...]) -> int:
    """How many JSON lists an array of ``shape`` is written as (each: two brackets, a comma)."""
    count, rows = 0, 1
    for d in shape:
        count += rows
        rows *= d
    return count


def array_estimate(arr: np.ndarray, floats: str = "float64") -> int:
    """About how many bytes :func:`dumps` writes for ``arr``, from a sample of its elements."""
    n = int(arr.size)
    if arr.ndim == 0:
        return len(_block(arr.reshape(1), floats)) - 2
    if n == 0:
        return 3 * _lists(arr.shape)
    if n <= SAMPLE:
        return len(_block(arr, floats))
    picks = np.unravel_index(np.linspace(0, n - 1, SAMPLE).astype(np.int64), arr.shape)
    sample = _block(np.asarray(arr[picks]), floats)
    per_element = (len(sample) - 2 + 1) / SAMPLE  # each element and the comma after it
    return math.ceil(per_element * n) + 3 * _lists(arr.shape[:-1])


def estimate(doc: Any, floats: str = "float64") -> int:
    """About how many bytes :func:`dumps` writes for ``doc`` (arrays estimated, the rest exact;
    a small answer exactly)."""
    encoded = small(doc, floats)
    if encoded is not None:
        return len(encoded)
    return _estimate(doc, floats)


def _estimate(doc: Any, floats: str) -> int:
    if isinstance(doc, (np.ndarray, np.generic)):
        return array_estimate(np.asarray(doc), floats)
    if isinstance(doc, Mapping):
        return 2 + sum(len(_plain(str(k))) + 2 + _estimate(v, floats) for k, v in doc.items())
    if isinstance(doc, (list, tuple)):
        return 2 + sum(_estimate(v, floats) + 1 for v in doc)
    return len(_plain(doc))


# --- writing -------------------------------------------------------------------------------


class _Writer:
    def __init__(self, limit: int, floats: str) -> None:
        self.out = bytearray()
        self.limit = limit
        self.floats = floats

    def add(self, piece: bytes) -> None:
        self.out += piece
        if self.limit and len(self.out) > self.limit:
            raise AnswerTooLarge(len(self.out), self.limit, "more than")

    def value(self, doc: Any) -> None:
        if isinstance(doc, (np.ndarray, np.generic)):  # a scalar of an array: written as its dtype
            self.array(np.asarray(doc))
        elif isinstance(doc, Mapping):
            self.add(b"{")
            for i, (key, item) in enumerate(doc.items()):
                self.add((b"," if i else b"") + _plain(str(key)) + b":")
                self.value(item)
            self.add(b"}")
        elif isinstance(doc, (list, tuple)):
            self.add(b"[")
            for i, item in enumerate(doc):
                if i:
                    self.add(b",")
                self.value(item)
            self.add(b"]")
        else:
            self.add(_plain(doc))

    def array(self, arr: np.ndarray) -> None:
        if arr.ndim == 0:
            self.add(_block(arr.reshape(1), self.floats)[1:-1])
        elif arr.size <= BLOCK:
            self.add(_block(arr, self.floats))
        elif arr.ndim == 1 or arr[0].size > BLOCK:
            # Rows too large to take together: a 1-D array in slices, else row by row.
            self.add(b"[")
            step = BLOCK if arr.ndim == 1 else 1
            for start in range(0, arr.shape[0], step):
                if start:
                    self.add(b",")
                if arr.ndim == 1:
                    self.add(_block(arr[start : start + step], self.floats)[1:-1])
                else:
                    self.array(arr[start])
            self.add(b"]")
        else:
            rows = max(1, BLOCK // max(1, arr[0].size))
            self.add(b"[")
            for start in range(0, arr.shape[0], rows):
                if start:
                    self.add(b",")
                self.add(_block(arr[start : start + rows], self.floats)[1:-1])
            self.add(b"]")


def dumps(doc: Any, limit: int = 0, *, floats: str = "float64") -> bytes | bytearray:
    """``doc`` (dicts, lists, plain values and numpy arrays) as JSON bytes; AnswerTooLarge
    when it would pass ``limit`` bytes (0: no limit), raised before it is built when the
    estimate says so. ``floats``: ``"float64"`` (the default) or ``"shortest"``."""
    encoded = small(doc, floats)
    if encoded is not None:
        if limit:
            check(len(encoded), limit)
        return encoded
    if limit:
        check(_estimate(doc, floats), limit, "about")
    writer = _Writer(limit, floats)
    writer.value(doc)
    return writer.out


__all__ = [
    "BLOCK",
    "SETTING",
    "AnswerTooLarge",
    "array_estimate",
    "check",
    "dumps",
    "estimate",
    "processor_outputs",
    "raw_size",
    "small",
    "small_with",
]
