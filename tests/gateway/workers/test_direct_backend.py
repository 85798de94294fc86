"""Where the worker's direct port runs a call: in the event loop when calls come one at a
time (the last turn of the loop saw at most one, the call is the first of its turn, nothing
is queued), on the compute thread otherwise. A real compute queue and ONNX processor."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gateway.config import ServiceConfig
from gateway.core.calls import WorkerRequest
from gateway.worker.compute import ComputeQueue
from gateway.worker.direct import ComputeBackend
from gateway.worker.processors.registry import create_processor


async def test_one_call_per_turn_runs_inline_and_a_busy_turn_goes_to_the_thread(
    models: dict[str, Path],
) -> None:
    proc = create_processor(ServiceConfig(name="spin", processor="onnx", model=str(models["spin"])))
    proc.load()
    compute = ComputeQueue(asyncio.get_running_loop(), proc)
    backend = ComputeBackend(compute)
    body = json.dumps({"inputs": {"n": 10}}).encode()

    async def turn(calls: int) -> int:
        """``calls`` dispatched in one turn of the loop, all answered; -> how many ran inline."""
        before = compute.inlined
        answers = await asyncio.gather(*(backend.dispatch(WorkerRequest(body), 5.0) for _ in range(calls)))
        assert [json.loads(a.body)["outputs"]["count"]["data"] for a in answers] == [[10.0]] * calls
        await asyncio.sleep(0)  # the turn is over whatever the answers took
        return compute.inlined - before

    try:
        assert await turn(1) == 1
        assert await turn(1) == 1
        assert await turn(5) == 1  # the first of the turn; the other four queued behind it
        assert await turn(1) == 0  # the last turn was busy: the thread
        assert await turn(1) == 1  # one at a time again
        assert compute.runs == 9
    finally:
        compute.shutdown()
