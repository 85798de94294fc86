"""The worker's inline fast path: small runs happen in the event loop, a slow one is
interrupted by the watchdog and finished on the compute thread (same answer); direct calls
run inline only when they come one at a time.

Whether one given small run stays inline depends on the machine: a worker stalled in the
middle of it by another process is interrupted like a slow run, and inline runs then pause
for a while. So the tests wait (with a deadline) for a small run to be answered inline
rather than expect every one to be. Likewise for a processor that cannot be interrupted
but whose runs its request's size bounds: a run within the bound may be stretched past it by
a busy machine, so the tests run a small request until one is allowed inline."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.backends.pool import WorkerPool
from gateway.config import ServiceConfig
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.worker.compute import ComputeQueue
from gateway.worker.processors.base import Batchable, Processor, ProcessorError
from tests.gateway.workers.conftest import echo_service
from tests.waiting import async_wait_until

MakePool = Callable[[ServiceConfig], Awaitable[WorkerPool]]


def _spin(n: int) -> WorkerRequest:
    return WorkerRequest(json.dumps({"inputs": {"n": n}}).encode())


async def _until_a_small_run_is_inline(pool: WorkerPool) -> dict[str, Any]:
    """Call with small runs until one is answered inline; -> the worker's counters then."""
    before = await pool.worker_stats(0)

    async def small_run_inline() -> dict[str, Any] | None:
        resp = await pool.dispatch(_spin(10), 5)
        assert json.loads(resp.body)["outputs"]["count"]["data"] == [10.0]
        stats = await pool.worker_stats(0)
        return stats if stats["inlined"] > before["inlined"] else None

    return await async_wait_until(small_run_inline, 20, "a small run answered inline")


async def test_fast_runs_inline_and_slow_run_moves_to_the_compute_thread(
    make_pool: MakePool, models: dict[str, Path]
) -> None:
    pool = await make_pool(ServiceConfig(name="spin", processor="onnx", model=str(models["spin"])))
    for n in (10, 1000):
        resp = await pool.dispatch(_spin(n), 5)
        assert json.loads(resp.body)["outputs"]["count"]["data"] == [float(n)]
    before = await _until_a_small_run_is_inline(pool)  # inline runs are not paused now
    # Far past the inline budget (seconds): interrupted, then run again to completion on the
    # thread, while the worker keeps answering pings.
    slow = asyncio.create_task(pool.dispatch(_spin(2_000_000), 20))

    async def preempted() -> dict[str, Any] | None:
        stats = await pool.worker_stats(0, timeout=5.0)
        return stats if stats["preempted"] > before["preempted"] else None

    stats = await async_wait_until(preempted, 20, "the slow inline run to be interrupted")
    assert not slow.done() and stats["outstanding"] == 1  # running on the thread now
    resp = await slow
    assert resp.status == 200 and json.loads(resp.body)["outputs"]["count"]["data"] == [2_000_000.0]
    resp = await pool.dispatch(_spin(5), 5)
    assert json.loads(resp.body)["outputs"]["count"]["data"] == [5.0]
    stats = await pool.worker_stats(0)
    assert stats["runs"] - before["runs"] == 2  # the slow run counts once, not twice
    assert (stats["preempted"] - before["preempted"], stats["outstanding"]) == (1, 0)


async def test_processors_that_cannot_interrupt_never_run_inline(make_pool: MakePool) -> None:
    pool = await make_pool(echo_service())
    assert (await pool.dispatch(WorkerRequest(b"hi"), 5)).body == b"hi"
    stats = await pool.worker_stats(0)
    assert stats["inlined"] == 0 and stats["runs"] == 1


def _direct_calls(port: int, bodies: list[bytes]) -> list[bytes]:
    """POST each body to the worker's direct port on a connection of its own, every request
    written before any answer is read (so they arrive together), answers in order."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in bodies]
    try:
        for s, body in zip(socks, bodies, strict=True):
            head = f"POST /api/predict/spin HTTP/1.1\r\nHost: w\r\nContent-Length: {len(body)}\r\n\r\n"
            s.sendall(head.encode() + body)
        answers = []
        for s in socks:
            data = b""
            while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
                chunk = s.recv(65536)
                assert chunk, data
                data += chunk
            answers.append(data)
        return answers
    finally:
        for s in socks:
            s.close()


def _length(data: bytes) -> int:
    head = data[: data.index(b"\r\n\r\n")].decode("latin-1").lower()
    return int(head.split("content-length:")[1].split("\r\n")[0])


async def test_direct_calls_one_at_a_time_run_inline(make_pool: MakePool, models: dict[str, Path]) -> None:
    pool = await make_pool(ServiceConfig(name="spin", processor="onnx", model=str(models["spin"])))
    port = pool.snapshot()[0]["http_port"]
    body = _spin(10).body
    before = await pool.worker_stats(0)
    calls = 0

    async def direct_call_inline() -> bool:
        nonlocal calls
        # One at a time: each alone in its turn of the worker's event loop.
        (answer,) = await asyncio.to_thread(_direct_calls, port, [body])
        assert answer.startswith(b"HTTP/1.1 200")
        calls += 1
        return (await pool.worker_stats(0))["inlined"] > before["inlined"]

    await async_wait_until(direct_call_inline, 20, "a direct call answered inline")
    after = await pool.worker_stats(0)
    assert after["runs"] - before["runs"] == calls
    # Sixteen arriving together are all answered (which of them ran where depends on how
    # the worker's turns split them: test_direct_backend.py tells the rule apart).
    answers = await asyncio.to_thread(_direct_calls, port, [body] * 16)
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers)
    assert (await pool.worker_stats(0))["runs"] - after["runs"] == 16


class _BySize(Processor):
    """A processor that cannot be interrupted but whose run its request's size bounds, as an
    estimator's: echoes the body; a body starting with ``slow`` first sleeps SLOW_S, far past
    the inline bound on any machine."""

    runs_by_size = True

    def __init__(self) -> None:
        super().__init__(ServiceConfig(name="by-size", processor="python"))

    def load(self) -> None:
        pass

    def handle(self, req: WorkerRequest) -> WorkerResponse:
        if req.body.startswith(b"slow"):
            time.sleep(SLOW_S)
        return WorkerResponse(200, req.body)


SLOW_S = 0.02
SMALL, SLOW_SMALL = b"fast" + b"x" * 60, b"slow" + b"x" * 60  # one size
LARGE = b"slow" + b"x" * 6000


async def _through_thread(compute: ComputeQueue, body: bytes) -> WorkerResponse:
    answer: asyncio.Future[WorkerResponse | None] = asyncio.get_running_loop().create_future()
    compute.submit(WorkerRequest(body), answer.set_result, inline=False)
    resp = await asyncio.wait_for(answer, 10)
    assert resp is not None and resp.body == body
    return resp


async def _until_inline(compute: ComputeQueue, body: bytes) -> None:
    """Run ``body`` on the thread until it may run inline: a run within the bound (a busy
    machine may stretch one past it) sets the size that may."""

    async def inline() -> bool:
        if compute.run_inline(WorkerRequest(body)) is not None:
            return True
        await _through_thread(compute, body)
        return False

    await async_wait_until(inline, 20, "a small request allowed to run inline")


async def test_a_processor_bounded_by_size_runs_inline_only_what_was_seen_to_run_fast() -> None:
    compute = ComputeQueue(asyncio.get_running_loop(), _BySize())
    try:
        assert compute.inline and compute.sized
        # Nothing seen yet: even a small request goes to the thread first.
        assert compute.run_inline(WorkerRequest(SMALL)) is None
        await _until_inline(compute, SMALL)
        # A larger request was never seen to run fast: the thread, however often it comes.
        for _ in range(3):
            assert compute.run_inline(WorkerRequest(LARGE)) is None
            await _through_thread(compute, LARGE)
        assert compute.run_inline(WorkerRequest(LARGE)) is None
        # A request of the size seen to run fast runs inline; when it was slow after all,
        # that size goes to the thread again, until a run of it there is fast once more.
        inlined = compute.inlined
        resp = compute.run_inline(WorkerRequest(SLOW_SMALL))
        assert resp is not None and resp.body == SLOW_SMALL and compute.inlined == inlined + 1
        assert compute.run_inline(WorkerRequest(SMALL)) is None
        await _until_inline(compute, SMALL)
    finally:
        compute.shutdown()
        assert await asyncio.to_thread(compute.join, 10)


@dataclass
class _Item:
    body: bytes
    key: str = "one"
    rows: int = 1


class _BatchBySize(_BySize, Batchable[_Item]):
    @property
    def supports_batching(self) -> bool:
        return True

    def prepare(self, req: WorkerRequest) -> _Item:
        return _Item(req.body)

    def process_batch(self, items: list[_Item]) -> list[WorkerResponse | ProcessorError]:
        return [self.handle(WorkerRequest(item.body)) for item in items]


async def test_a_batching_queue_never_runs_a_call_inline() -> None:
    """Calls answered in the event loop as they come would never queue, so they would never
    share a run: under load, all that greedy batching gains."""
    compute = ComputeQueue(asyncio.get_running_loop(), _BatchBySize(), max_batch_size=8, max_latency_ms=0)
    try:
        assert compute.max_batch == 8 and not compute.inline
        for _ in range(3):
            await _through_thread(compute, SMALL)
        assert compute.run_inline(WorkerRequest(SMALL)) is None and compute.inlined == 0
    finally:
        compute.shutdown()
        assert await asyncio.to_thread(compute.join, 10)
