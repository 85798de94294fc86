"""Compressed request bodies are inflated only up to the body limit: a bomb costs the limit,
not what it would inflate to."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import pytest

from gateway.core import errors
from gateway.http.body import inflate

LIMIT = 1 << 20


def test_gzip_bomb_is_refused_after_inflating_the_limit_only() -> None:
    bomb = gzip.compress(b"\0" * (200 << 20), compresslevel=9)  # 200 MB in about 200 kB
    tracemalloc.start()
    try:
        with pytest.raises(errors.PayloadTooLarge):
            inflate(bomb, "gzip", LIMIT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * LIMIT, peak  # about the limit inflated, not 200 MB


def test_a_lying_trailer_does_not_matter() -> None:
    bomb = bytearray(gzip.compress(b"\0" * (4 * LIMIT)))
    bomb[-4:] = (10).to_bytes(4, "little")  # claims 10 bytes
    with pytest.raises(errors.PayloadTooLarge):
        inflate(bytes(bomb), "gzip", LIMIT)


def test_bodies_within_the_limit_inflate() -> None:
    data = b"payload" * 1000
    assert inflate(gzip.compress(data), "gzip", LIMIT) == data
    assert inflate(zlib.compress(data), "deflate", LIMIT) == data
    with pytest.raises(errors.BadRequest):
        inflate(b"not gzip at all, not at all", "gzip", LIMIT)
