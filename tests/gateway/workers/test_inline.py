"""The worker's inline fast path: small runs happen in the event loop, a slow one is
interrupted by the watchdog and finished on the compute thread (same answer)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from gateway.config import ServiceConfig
from gateway.workers.ipc import WorkerRequest
from gateway.workers.pool import WorkerPool
from tests.gateway.workers.conftest import echo_service

MakePool = Callable[[ServiceConfig], Awaitable[WorkerPool]]


def _spin(n: int) -> WorkerRequest:
    return WorkerRequest(json.dumps({"inputs": {"n": n}}).encode())


async def test_fast_runs_inline_and_slow_run_moves_to_the_compute_thread(
    make_pool: MakePool, models: dict[str, Path]
) -> None:
    pool = await make_pool(ServiceConfig(name="spin", processor="onnx", model=str(models["spin"])))
    for n in (10, 1000):
        resp = await pool.dispatch(_spin(n), 5)
        assert json.loads(resp.body)["outputs"]["count"]["data"] == [float(n)]
    stats = await pool.worker_stats(0)
    assert (stats["inlined"], stats["preempted"], stats["runs"]) == (2, 0, 2)
    # Far past the inline budget: interrupted, then run again to completion on the thread,
    # while the worker keeps answering pings.
    slow = asyncio.create_task(pool.dispatch(_spin(2_000_000), 20))
    await asyncio.sleep(0.2)
    stats = await pool.worker_stats(0, timeout=1.0)
    assert stats["preempted"] == 1 and stats["outstanding"] == 1
    resp = await slow
    assert resp.status == 200 and json.loads(resp.body)["outputs"]["count"]["data"] == [2_000_000.0]
    resp = await pool.dispatch(_spin(5), 5)
    assert json.loads(resp.body)["outputs"]["count"]["data"] == [5.0]
    stats = await pool.worker_stats(0)
    assert (stats["runs"], stats["preempted"], stats["outstanding"]) == (4, 1, 0)


async def test_processors_that_cannot_interrupt_never_run_inline(make_pool: MakePool) -> None:
    pool = await make_pool(echo_service())
    assert (await pool.dispatch(WorkerRequest(b"hi"), 5)).body == b"hi"
    stats = await pool.worker_stats(0)
    assert stats["inlined"] == 0 and stats["runs"] == 1
