"""Where the worker's direct port runs a call: offered to the event loop (inline) when calls
come one at a time, on the compute thread when many arrive together, and on the thread
whenever the compute queue declines to run it inline.

The choice is checked on a stand-in compute queue that records which way each call went,
so nothing depends on how long a run takes; how much inline runs save is a speed figure
(benchmarks/bench_worker_hop.py). A real compute queue and ONNX processor check that every
call is answered whichever way it goes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gateway.config import ServiceConfig
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.worker.compute import ComputeQueue
from gateway.worker.direct import ComputeBackend
from gateway.worker.processors.registry import create_processor

BURST = 16  # calls dispatched in one turn of the loop: clearly not "one at a time"


class _Recording:
    """The part of ComputeQueue that ComputeBackend uses; answers at once and records which
    way each call went. ``decline``: run_inline refuses every call (the queue is busy, or
    inline runs are paused)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, decline: bool = False) -> None:
        self.loop = loop
        self.decline = decline
        self.ways: list[str] = []

    def run_inline(self, req: WorkerRequest) -> WorkerResponse | None:
        if self.decline:
            self.ways.append("declined")
            return None
        self.ways.append("inline")
        return WorkerResponse(200, bytes(req.body))

    async def run(self, req: WorkerRequest) -> WorkerResponse:
        self.ways.append("thread")
        return WorkerResponse(200, bytes(req.body))


async def _turn(backend: ComputeBackend, calls: int) -> None:
    """``calls`` dispatched in one turn of the loop and answered; returns once that turn is
    over (a turn ends when the loop runs the callbacks queued in it)."""
    bodies = [b"%d" % i for i in range(calls)]
    answers = await asyncio.gather(*(backend.dispatch(WorkerRequest(b), 5.0) for b in bodies))
    assert [a.body for a in answers] == bodies
    await asyncio.sleep(0)


async def test_a_call_alone_is_offered_to_run_inline() -> None:
    compute = _Recording(asyncio.get_running_loop())
    backend = ComputeBackend(compute)  # type: ignore[arg-type]
    for _ in range(3):
        await _turn(backend, 1)
    assert compute.ways == ["inline"] * 3


async def test_calls_arriving_together_go_to_the_compute_thread() -> None:
    compute = _Recording(asyncio.get_running_loop())
    backend = ComputeBackend(compute)  # type: ignore[arg-type]
    await _turn(backend, BURST)
    assert compute.ways.count("thread") >= BURST // 2, compute.ways
    # Calls that keep arriving together keep going to the thread; once they come one at a
    # time again, they are offered to the loop again.
    compute.ways.clear()
    await _turn(backend, BURST)
    assert compute.ways.count("thread") >= BURST // 2, compute.ways
    for _ in range(3):
        await _turn(backend, 1)
    assert compute.ways[-1] == "inline", compute.ways


async def test_a_call_the_queue_declines_to_run_inline_goes_to_the_thread() -> None:
    compute = _Recording(asyncio.get_running_loop(), decline=True)
    backend = ComputeBackend(compute)  # type: ignore[arg-type]
    await _turn(backend, 1)
    assert compute.ways == ["declined", "thread"]


async def test_every_call_is_answered_whichever_way_it_runs(models: dict[str, Path]) -> None:
    proc = create_processor(ServiceConfig(name="spin", processor="onnx", model=str(models["spin"])))
    proc.load()
    compute = ComputeQueue(asyncio.get_running_loop(), proc)
    backend = ComputeBackend(compute)
    body = json.dumps({"inputs": {"n": 10}}).encode()
    calls = 0
    try:
        for size in (1, 1, BURST, 1, 1):
            answers = await asyncio.gather(*(backend.dispatch(WorkerRequest(body), 5.0) for _ in range(size)))
            assert [json.loads(a.body)["outputs"]["count"]["data"] for a in answers] == [[10.0]] * size
            calls += size
            await asyncio.sleep(0)  # the turn is over whatever the answers took
        assert compute.runs == calls  # each call ran once, inline or on the thread
        assert compute.outstanding == 0
    finally:
        compute.shutdown()
