"""The parser process: results and the protocols' errors come back intact, one parse runs
at a time, and a parse that kills the process is answered 503 without breaking the next."""

from __future__ import annotations

import asyncio
import functools
import json
import os

import numpy as np
import pytest

from gateway.codecs import cluster_serving, v2_infer
from gateway.core import errors, parse_pool


@pytest.fixture(autouse=True)
def _fresh_pool() -> object:
    yield
    parse_pool.shutdown()


def _pid() -> int:
    return os.getpid()


def _die() -> None:
    os._exit(9)


def test_v2_request_is_parsed_in_another_process() -> None:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]}]})

    async def go() -> tuple[int, v2_infer.InferRequest]:
        pid = await parse_pool.parse_off_loop(_pid)
        req = await parse_pool.parse_off_loop(functools.partial(v2_infer.parse_request, body.encode(), None))
        return pid, req

    pid, req = asyncio.run(go())
    assert pid != os.getpid()
    np.testing.assert_array_equal(req.inputs["x"], np.array([[1, 2], [3, 4]], dtype=np.float32))


def test_a_protocol_error_keeps_its_status() -> None:
    parse = functools.partial(cluster_serving.parse_request, b'{"instances": [{"a": [1, 2]}]}', max_values=1)
    with pytest.raises(cluster_serving.ClusterServingRequestError) as info:
        asyncio.run(parse_pool.parse_off_loop(parse))
    assert info.value.status == 413 and "JSON values" in str(info.value)


def test_a_dead_parser_is_answered_503_and_replaced() -> None:
    async def go() -> int:
        with pytest.raises(errors.ServiceNotReady) as info:
            await parse_pool.parse_off_loop(_die)
        assert info.value.status == 503
        return await parse_pool.parse_off_loop(_pid)

    assert asyncio.run(go()) != os.getpid()


def test_parses_take_turns() -> None:
    async def go() -> list[int]:
        return await asyncio.gather(*(parse_pool.parse_off_loop(_pid) for _ in range(4)))

    pids = asyncio.run(go())
    assert len(set(pids)) == 1  # one helper, reused


def _niceness() -> int:
    return os.nice(0)


# The kernel's lowest priority: a niceness past it is clamped to it.
MAX_NICENESS = 19


def test_the_parser_yields_the_cores_to_the_event_loop() -> None:
    """The parser runs PARSER_NICENESS below the process that started it, as far as the
    kernel allows: a suite run under ``nice`` (say 15) leaves it at 19, not at 25."""
    want = min(MAX_NICENESS, os.nice(0) + parse_pool.PARSER_NICENESS)
    assert asyncio.run(parse_pool.parse_off_loop(_niceness)) == want
