"""How the compute thread hands answers back to the event loop: queued requests that finish
together wake the loop once, and no answer waits for the others longer than the bound."""

from __future__ import annotations

import asyncio

from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.worker.compute import ComputeQueue
from gateway.worker.processors.registry import create_processor
from tests.gateway.workers.test_worker_health import misbehaving


async def _queue_all(compute: ComputeQueue, bodies: list[bytes]) -> list[tuple[bytes, int]]:
    """Submit every body to the compute thread at once; -> (answer body, runs done when it
    was delivered), in delivery order."""
    loop = asyncio.get_running_loop()
    delivered: list[tuple[bytes, int]] = []
    all_in = loop.create_future()

    def done(resp: WorkerResponse | None) -> None:
        assert resp is not None
        delivered.append((bytes(resp.body), compute.runs))
        if len(delivered) == len(bodies) and not all_in.done():
            all_in.set_result(None)

    for body in bodies:
        compute.submit(WorkerRequest(body), done, inline=False)
    await asyncio.wait_for(all_in, 30)
    return delivered


async def test_answers_finished_together_wake_the_loop_once() -> None:
    compute = ComputeQueue(asyncio.get_running_loop(), _loaded())
    wakes = 0
    deliver = compute._deliver

    def counted() -> None:
        nonlocal wakes
        wakes += 1
        deliver()

    compute._deliver = counted  # type: ignore[method-assign]
    try:
        delivered = await _queue_all(compute, [b"sleep:0.0001"] * 60)
    finally:
        compute.shutdown()
    assert [b for b, _ in delivered] == [b"slept"] * 60
    # Handed over one by one, each answer would wake the idle loop: about 60 wake-ups. Held
    # while more are queued (100 µs runs, a 500 µs bound), they come a few at a time.
    assert wakes <= 30, wakes


async def test_no_answer_waits_for_the_whole_queue() -> None:
    compute = ComputeQueue(asyncio.get_running_loop(), _loaded())
    try:
        # Five runs of 20 ms each, far over what is worth holding for: each answer is handed
        # over as its run ends, while the next run goes on (not kept for it, nor for all five).
        delivered = await _queue_all(compute, [b"sleep:0.02"] * 5)
    finally:
        compute.shutdown()
    assert [b for b, _ in delivered] == [b"slept"] * 5
    first_runs = delivered[0][1]
    assert first_runs <= 2, delivered


def _loaded():  # type: ignore[no-untyped-def]
    proc = create_processor(misbehaving())
    proc.load()
    return proc
