"""JSON answers holding tensors: the same text as Python's own lists, estimated before they
are built, refused past the limit, and written without a Python object per element."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.core import json_answer
from gateway.core.json_answer import BLOCK, AnswerTooLarge, dumps, estimate


def _as_python(doc: object) -> bytes:
    """What the gateway wrote before: each array as its Python lists, encoded by orjson."""

    def plain(v: object) -> object:
        if isinstance(v, np.ndarray):
            if v.dtype.kind in "OSU":
                return np.vectorize(
                    lambda x: x.decode() if isinstance(x, bytes) else str(x), otypes=[object]
                )(v).tolist()
            return v.tolist()
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    return orjson.dumps(plain(doc))


ARRAYS = [
    np.arange(12, dtype=np.int64).reshape(3, 4),
    np.linspace(-1, 1, 7, dtype=np.float32),
    np.array([0.1, np.nan, np.inf, -np.inf], dtype=np.float64),
    np.array([1.5, 2.25], dtype=np.float16),
    np.array([[True, False]]),
    np.array([2**64 - 1, 0], dtype=np.uint64),
    np.arange(6, dtype=">i4").reshape(2, 3),  # big-endian, as a protobuf view may be
    np.arange(24, dtype=np.float32).reshape(2, 3, 4)[:, ::2, 1:],  # not contiguous
    np.zeros((2, 0, 3), dtype=np.float32),
    np.array(3.5, dtype=np.float32),
    np.array([b"caf\xc3\xa9", b"x"], dtype=object),
    np.array([["a", "bb"], ["c", "d"]]),
]


@pytest.mark.parametrize("arr", ARRAYS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_the_text_is_what_python_lists_give(arr: np.ndarray) -> None:
    doc = {"predictions": [{"y": arr, "n": 1}], "id": "r"}
    assert bytes(dumps(doc)) == _as_python(doc)
    assert json.loads(dumps(doc)) == json.loads(_as_python(doc))


@pytest.mark.parametrize(
    "shape", [(BLOCK * 3 + 5,), (3, BLOCK + 7), (2, 3, BLOCK // 2 + 1), (BLOCK + 1, 2), (1, 300, 300)]
)
def test_large_arrays_are_written_in_blocks_with_the_same_text(shape: tuple[int, ...]) -> None:
    arr = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    assert bytes(dumps({"y": arr})) == _as_python({"y": arr})


def test_the_estimate_is_close_to_the_text() -> None:
    rng = np.random.default_rng(2)
    for arr in (
        rng.standard_normal((500, 300)).astype(np.float32),
        np.zeros((700, 700)),
        rng.integers(0, 9, 10**6),
    ):
        size, guess = len(dumps({"y": arr})), estimate({"y": arr})
        assert abs(guess - size) <= 0.05 * size, (arr.dtype, size, guess)


def test_an_answer_over_the_limit_is_refused_before_it_is_built() -> None:
    """A [3000, 3000] float32 answer of non-zero values is about 180 MB of text: refused
    from its estimate, with no more memory than the sample takes."""
    arr = np.full((1, 3000, 3000), 0.1, dtype=np.float32)
    tracemalloc.start()
    try:
        with pytest.raises(AnswerTooLarge) as caught:
            dumps({"predictions": [{"y": arr}]}, 64 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    message = str(caught.value)
    assert message.startswith("the answer would be about 18"), message
    assert "over the limit of 67108864 bytes (64.0 MiB) set by gateway.max_response_bytes" in message
    assert caught.value.status == 413 and caught.value.code == "ResponseTooLarge"


def test_an_answer_under_the_limit_takes_no_python_object_per_element() -> None:
    arr = np.zeros((1, 3000, 3000), dtype=np.float32)  # 36 MB as float32, about 36 MB as text
    tracemalloc.start()
    try:
        body = dumps({"predictions": [{"y": arr}]}, 64 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The text itself and a block's worth of work; 9 million Python floats would take 300 MB.
    assert len(body) < peak < len(body) * 1.5 + (8 << 20), (len(body), peak)
    assert body.startswith(b'{"predictions":[{"y":[[[0.0,0.0,') and body.endswith(b"0.0]]]}]}")


def test_an_estimate_that_misses_still_stops_at_the_limit() -> None:
    """Long values where the sample sees none: the writing stops once past the limit."""
    arr = np.full(BLOCK * 40, 0.1234567890123, dtype=np.float64)
    arr[np.linspace(0, arr.size - 1, json_answer.SAMPLE).astype(np.int64)] = 0.0  # all it samples
    limit = 2 * estimate(arr)
    with pytest.raises(AnswerTooLarge, match=r"would be more than \d+ bytes"):
        dumps(arr, limit)
    assert len(dumps(arr)) > limit


def test_binary_sizes_and_the_plain_check() -> None:
    assert json_answer.raw_size(np.zeros((3, 4), dtype=np.float32)) == 48
    assert json_answer.raw_size(np.array([b"ab", "c\u00e9"], dtype=object)) == 4 + 2 + 4 + 3
    json_answer.check(10, 10)
    json_answer.check(10**12, 0)  # no limit
    with pytest.raises(AnswerTooLarge, match="would be 11 bytes"):
        json_answer.check(11, 10)


_SMALL_DOCS = [
    {"a": np.array([0.1, np.nan, -np.inf, 1e-30], dtype=np.float32), "b": b"name", "c": [1, "x", None]},
    {
        "s": np.float32(0.1),
        "h": np.array(1.5, dtype=np.float16),
        "i": np.array([[1, 2], [3, 4]], dtype=">i4"),
    },
    {"t": (np.array([True, False]), np.uint8(7)), "e": np.zeros((0, 3), dtype=np.float64), "n": 2.5},
    [{"k": np.arange(6, dtype=np.int64).reshape(2, 3)}, np.array(3.25)],
]


@pytest.mark.parametrize("floats", ["float64", "shortest"])
@pytest.mark.parametrize("doc", _SMALL_DOCS, ids=range(len(_SMALL_DOCS)))
def test_a_small_answer_encoded_in_one_call_is_what_the_block_writer_writes(doc: Any, floats: str) -> None:
    # Small answers skip the estimate and the piece-by-piece writer; the text must not change.
    writer = json_answer._Writer(0, floats)
    writer.value(doc)
    one_call = json_answer.dumps(doc, 1 << 20, floats=floats)
    assert bytes(one_call) == bytes(writer.out)
    assert json_answer.estimate(doc, floats) == len(writer.out)


@pytest.mark.parametrize("floats", ["float64", "shortest"])
@pytest.mark.parametrize(
    "arr",
    [
        np.array([0.1, np.nan, -np.inf, 1e-30], dtype=np.float32),
        np.array([[1, 2], [3, 4]], dtype=">i4").reshape(-1),
        np.array([True, False]),
        np.zeros(0, dtype=np.float64),
        np.array([1.5, 2.25], dtype=np.float16),
    ],
    ids=range(5),
)
def test_a_document_with_its_arrays_named_is_written_as_the_block_writer_writes_it(
    arr: np.ndarray, floats: str
) -> None:
    entry: dict[str, Any] = {"name": "y", "shape": [int(arr.size)], "data": arr}
    doc = {"model_name": "m", "id": "r1", "outputs": [entry]}
    writer = json_answer._Writer(0, floats)
    writer.value(doc)
    assert json_answer.small_with(doc, [(entry, "data")], floats) == bytes(writer.out)


def test_a_document_with_large_or_text_arrays_is_left_to_the_bounded_writer() -> None:
    big = {"data": np.zeros(json_answer.SMALL + 1, dtype=np.float32)}
    text = {"data": np.array(["a", "b"], dtype=object)}
    for entry in (big, text):
        kept = entry["data"]
        assert json_answer.small_with({"outputs": [entry]}, [(entry, "data")]) is None
        assert entry["data"] is kept  # untouched: the estimate and the writer read it next
