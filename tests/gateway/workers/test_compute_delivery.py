"""How the compute thread hands answers back to the event loop: every answer arrives, in
order; answers that finished while the loop was busy come in one wake-up; and an answer is
never kept waiting for more than the run after it.

Runs are gated by the test (a run lasts until the test opens its gate), so what is checked
does not depend on how fast the machine is. How few wake-ups a queue of short runs costs
is a speed figure: benchmarks/bench_worker_hop.py measures it."""

from __future__ import annotations

import asyncio
import threading

from gateway.config import ServiceConfig
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.worker.compute import ComputeQueue
from gateway.worker.processors.base import Processor

WAIT_S = 10.0  # far more than any step needs; only reached when the behaviour is broken


class _Gated(Processor):
    """Echoes the body. A body ``gate:<i>`` first waits for ``gates[i]`` (a run as long as
    the test wants); ``finished`` is set once ``expect`` runs have ended."""

    def __init__(self, gates: int = 0, expect: int = 0) -> None:
        super().__init__(ServiceConfig(name="gated", processor="python"))
        self.gates = [threading.Event() for _ in range(gates)]
        self.expect = expect
        self.ended = 0
        self.finished = threading.Event()

    def load(self) -> None:
        pass

    def handle(self, req: WorkerRequest) -> WorkerResponse:
        body = bytes(req.body)
        if body.startswith(b"gate:"):
            assert self.gates[int(body[5:])].wait(WAIT_S), "the test never opened this gate"
        self.ended += 1  # one compute thread: no race
        if self.ended == self.expect:
            self.finished.set()
        return WorkerResponse(200, body)


class _Deliveries:
    """The answers in delivery order, and how many each wake-up of the loop brought."""

    def __init__(self, compute: ComputeQueue) -> None:
        self.answers: list[bytes] = []
        self.per_wake: list[int] = []
        self.arrived: dict[bytes, asyncio.Event] = {}
        deliver = compute._deliver

        def counted() -> None:
            before = len(self.answers)
            deliver()
            self.per_wake.append(len(self.answers) - before)

        compute._deliver = counted  # type: ignore[method-assign]

    def done(self, resp: WorkerResponse | None) -> None:
        assert resp is not None and resp.status == 200, resp
        body = bytes(resp.body)
        self.answers.append(body)
        self.arrived.setdefault(body, asyncio.Event()).set()

    async def wait_for(self, body: bytes) -> None:
        await asyncio.wait_for(self.arrived.setdefault(body, asyncio.Event()).wait(), WAIT_S)


async def test_every_answer_of_a_queue_of_short_runs_arrives_in_order() -> None:
    """Short runs with more queued behind them are the case where answers are held back
    and handed over together: none may be left behind, the last one included."""
    compute = ComputeQueue(asyncio.get_running_loop(), _Gated())
    got = _Deliveries(compute)
    bodies = [b"%d" % i for i in range(200)]
    try:
        for body in bodies:
            compute.submit(WorkerRequest(body), got.done, inline=False)
        await got.wait_for(bodies[-1])
    finally:
        compute.shutdown()
    assert got.answers == bodies
    assert 0 not in got.per_wake  # every wake-up of the loop brought an answer
    assert compute.outstanding == 0 and compute.idle.is_set()


async def test_answers_finished_while_the_loop_is_busy_come_in_one_wake_up() -> None:
    n = 20
    proc = _Gated(expect=n)
    compute = ComputeQueue(asyncio.get_running_loop(), proc)
    got = _Deliveries(compute)
    bodies = [b"%d" % i for i in range(n)]
    try:
        for body in bodies:
            compute.submit(WorkerRequest(body), got.done, inline=False)
        # Hold the event loop (a blocking wait, on purpose) until every run has ended: all
        # the answers are waiting for it when it resumes.
        assert proc.finished.wait(WAIT_S)
        await got.wait_for(bodies[-1])
    finally:
        compute.shutdown()
    assert got.answers == bodies
    # Handed over one by one, each answer would have queued a wake-up of its own.
    assert got.per_wake == [n], got.per_wake


async def test_an_answer_waits_for_at_most_the_run_after_it() -> None:
    """A held answer goes out when the next run ends, never later: here the run after the
    next one does not end until the answer is in."""
    proc = _Gated(gates=2)
    compute = ComputeQueue(asyncio.get_running_loop(), proc)
    got = _Deliveries(compute)
    try:
        for body in (b"first", b"gate:0", b"gate:1"):
            compute.submit(WorkerRequest(body), got.done, inline=False)
        proc.gates[0].set()
        await got.wait_for(b"first")  # while gate:1 is still running
        assert not proc.gates[1].is_set()
        proc.gates[1].set()
        await got.wait_for(b"gate:1")
    finally:
        for gate in proc.gates:
            gate.set()
        compute.shutdown()
    assert got.answers == [b"first", b"gate:0", b"gate:1"]
