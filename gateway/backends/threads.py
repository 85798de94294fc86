"""An onnx service run in the gateway process (``placement: thread``): no worker processes.

Each of the service's ``workers`` is one ONNX Runtime session (``intra_op_threads`` threads
of its own) with a compute thread, the worker's own compute queue
(gateway.worker.compute): the same deadline checks, cancellation (ONNX Runtime's terminate
flag) and dynamic batching as in a worker process, and the same onnx processor, so every
protocol gets the same checks, answers and errors. What goes away is the hop to a worker:
no encoding, no socket, no second process to wake, and the V2 and gRPC adapters hand their
arrays over as they are (gateway.core.calls).

ONNX Runtime releases the GIL while it computes, so the event loop keeps serving during a
run on the compute thread. A call that finds its session idle runs right in the event loop
instead (the compute queue's inline path) while the model is small: a hand-off to the
compute thread and back costs two thread wake-ups, more than a small model's run (measured
on the digits model's V2 JSON calls, one connection on one core: a median latency of
125-136 µs inline against 177-205 µs through the thread, a third more calls per second).
Two runs in a row that took longer than ``INLINE_MAX_S`` send the calls after them to the
compute thread for a second, and the compute queue's watchdog interrupts an inline run past its hard
budget (10 ms), which then reruns on the thread: a large model never holds the loop long.

The price is isolation: a model that crashes takes the gateway with it, and a stuck run is
interrupted, never killed. Such a service has no worker to call directly: discovery lists
the gateway's own address for it (as for a pipeline), so a direct-mode client calls the
gateway, where the model already is. Readiness, the pending limit, timeouts and their errors
are the worker pool's (gateway.backends.pool); ``stall_timeout_s`` is not used: a run past its
call's timeout is interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any

from gateway.backends.in_gateway import RunsInGateway
from gateway.backends.pool import NoReadyWorker, PoolOverloaded, UpstreamTimeout
from gateway.backends.supervision import public_message
from gateway.config import GatewayConfig, ServiceConfig
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.core.metadata import ModelMetadata
from gateway.worker.compute import ComputeQueue
from gateway.worker.processors.base import Processor
from gateway.worker.processors.registry import create_processor

log = logging.getLogger("gateway.pool")

# Runs in the event loop that take longer than this (twice in a row) send the next calls to
# the compute thread for a while (gateway.worker.compute): below it a run holds the loop no longer than
# parsing a mid-sized request does, and the hand-off to a thread and back (two wake-ups, a
# few tens of microseconds of CPU) would cost more than it frees. The sample digits model
# runs in about 5 µs, a 224x224 convolution in tens.
INLINE_MAX_S = 0.001
# How long a stopping session waits for its compute thread to end.
CLOSE_WAIT_S = 5.0


class _Session:
    """One ONNX Runtime session and the compute queue that runs it."""

    __slots__ = ("error", "index", "processor", "queue", "state", "task")

    def __init__(self, index: int, processor: Processor) -> None:
        self.index = index
        self.processor = processor
        self.queue: ComputeQueue | None = None
        self.state = "starting"  # then ready, failed, draining, stopped (a worker's states)
        self.error: str | None = None
        self.task: asyncio.Task[None] | None = None


class ThreadService(RunsInGateway):
    """A ``placement: thread`` service's backend: a ``ServiceBackend`` (gateway.core.backend)
    in full, its sessions in the place of a pool's workers."""

    # The V2 and gRPC adapters hand their arrays over unencoded (DataPlane.tensors_call).
    takes_tensors = True
    restarts_total = 0  # a session is never restarted: a model that loaded keeps running

    def __init__(self, service: ServiceConfig, gateway: GatewayConfig) -> None:
        self.service = service
        self.gateway = gateway
        self.metadata: ModelMetadata | None = None
        self._sessions: list[_Session] = []
        self._pending = 0
        self._started = False
        self._stopping = False
        self._changed: asyncio.Event | None = None  # set whenever a session loads or fails
        self._drained: asyncio.Event | None = None

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Load every session in the background and return at once (see wait_ready)."""
        if self._started:
            return
        self._started = True
        self._changed = asyncio.Event()
        self._drained = asyncio.Event()
        for _ in range(self.service.workers):
            self._add()

    def _add(self) -> None:
        index = max((s.index for s in self._sessions), default=-1) + 1
        session = _Session(index, create_processor(self.service))
        self._sessions.append(session)
        session.task = asyncio.create_task(self._load(session), name=f"load-{self.service.name}-{index}")

    async def _load(self, session: _Session) -> None:
        svc = self.service
        try:
            # Off the loop: opening a session reads and optimises the model.
            await asyncio.to_thread(session.processor.load)
            meta = session.processor.metadata()
        except Exception as exc:
            session.state, session.error = "failed", str(exc) or type(exc).__name__
            log.error("service %s: session %d failed to load: %s", svc.name, session.index, session.error)
        else:
            if session.state == "starting":  # not stopped while it loaded
                self.metadata = meta
                session.queue = ComputeQueue(
                    asyncio.get_running_loop(), session.processor, 1,
                    svc.batching.max_batch_size, svc.batching.max_latency_ms, svc.stall_timeout_s,
                    INLINE_MAX_S,
                )  # fmt: skip
                session.state = "ready"
            else:
                session.processor.close()
        assert self._changed is not None
        self._changed.set()

    async def _wait(self, done: Any, timeout: float) -> bool:
        """Wait until ``done()`` gives True (-> True) or False (-> False); None: go on waiting."""
        assert self._changed is not None, "start() first"
        deadline = time.monotonic() + timeout
        while True:
            verdict = done()
            if verdict is not None:
                return bool(verdict)
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def wait_ready(self, timeout: float) -> bool:
        """True once one session is ready; False after ``timeout`` or once every one failed."""

        def done() -> bool | None:
            states = [s.state for s in self._sessions]
            if "ready" in states:
                return True
            return False if all(st == "failed" for st in states) else None

        return await self._wait(done, timeout)

    async def wait_all_ready(self, timeout: float) -> bool:
        """True once every session is ready; False after ``timeout`` or once one failed (a
        new version that does not load must not replace a working one)."""

        def done() -> bool | None:
            states = [s.state for s in self._sessions if s.state != "draining"]
            if "failed" in states or self._stopping:
                return False
            return True if all(st == "ready" for st in states) else None

        return await self._wait(done, timeout)

    async def scale(self, workers: int, drain_timeout: float) -> None:
        """Run ``workers`` sessions: new ones load in the background; surplus ones leave
        routing at once, answer what they hold, then close."""
        live = [s for s in self._sessions if s.state != "draining"]
        for _ in range(workers - len(live)):
            self._add()
        surplus = live[workers:] if workers < len(live) else []
        for s in surplus:
            s.state = "draining"
        await asyncio.gather(*(self._retire(s, drain_timeout) for s in surplus))

    async def _retire(self, session: _Session, drain_timeout: float) -> None:
        queue = session.queue
        if queue is not None and queue.outstanding:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(queue.idle.wait(), max(0.0, drain_timeout))
        await self._close(session)
        if session in self._sessions:
            self._sessions.remove(session)

    async def _close(self, session: _Session) -> None:
        """Stop the session's compute thread and wait for it (bounded): calls still queued
        past the drain run or are dropped at their deadline, the one running is interrupted.
        The gateway must not exit while the thread is inside ONNX Runtime."""
        session.state = "stopped"
        queue, session.queue = session.queue, None
        if queue is None:
            return
        queue.shutdown()
        session.processor.cancel_running()
        if not await asyncio.to_thread(queue.join, CLOSE_WAIT_S):
            log.warning("service %s: session %d still running at stop", self.service.name, session.index)
        session.processor.close()

    async def stop(self, drain_timeout: float) -> None:
        """Take no more calls, let those in flight finish (bounded), then close the sessions."""
        if self._stopping:
            return
        self._stopping = True
        if self._pending and self._drained is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained.wait(), max(0.0, drain_timeout))
        for s in self._sessions:
            if s.task is not None and not s.task.done():
                s.state = "stopped"  # _load closes it once loaded
        await asyncio.gather(*(self._close(s) for s in self._sessions))
        if self._changed is not None:
            self._changed.set()

    # --- dispatch --------------------------------------------------------------------

    def _pick(self) -> ComputeQueue | None:
        best: ComputeQueue | None = None
        for s in self._sessions:
            q = s.queue
            if s.state == "ready" and q is not None and (best is None or q.outstanding < best.outstanding):
                best = q
        return best

    async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        if self._stopping:
            raise self._not_ready()
        svc = self.service
        if self._pending >= svc.max_pending:
            raise PoolOverloaded(
                f"service {svc.name} is busy: {self._pending} requests pending "
                f"(max_pending {svc.max_pending})"
            )
        queue = self._pick()
        if queue is None:
            raise self._not_ready()
        deadline = time.monotonic() + timeout
        if not req.deadline or req.deadline > deadline:
            req.deadline = deadline
        # Answered at once when it runs inline (see the module docstring).
        resp = queue.run_inline(req)
        if resp is not None:
            return resp
        answer: list[WorkerResponse | None] = []
        fut: asyncio.Future[None] | None = None

        def done(resp: WorkerResponse | None) -> None:
            answer.append(resp)
            if fut is not None and not fut.done():
                fut.set_result(None)

        self._pending += 1
        try:
            job = queue.submit(req, done, inline=False)
            assert job is not None  # never answered inline when not asked to
            if not answer:
                fut = asyncio.get_running_loop().create_future()
                try:
                    await asyncio.wait_for(fut, timeout)
                except asyncio.TimeoutError:
                    queue.cancel(job)  # never run when still queued; interrupted when running
                    raise UpstreamTimeout(
                        f"no answer from service {svc.name} within {timeout:.3g} s"
                    ) from None
                except asyncio.CancelledError:
                    queue.cancel(job)
                    raise
        finally:
            self._pending -= 1
            if self._stopping and self._pending == 0 and self._drained is not None:
                self._drained.set()
        resp = answer[0]
        if resp is None:  # dropped unrun: cancelled (cannot happen here) or expired
            raise UpstreamTimeout(f"no answer from service {svc.name} within {timeout:.3g} s")
        return resp

    def _not_ready(self) -> NoReadyWorker:
        reason = self.not_ready_reason() or "it has no ready session"
        return NoReadyWorker(f"service {self.service.name} is not ready: {reason}", 1)

    # --- figures -----------------------------------------------------------------------

    def is_ready(self) -> bool:
        return not self._stopping and any(s.state == "ready" for s in self._sessions)

    def not_ready_reason(self) -> str | None:
        """None while a session is ready; otherwise why not, as a client may read it."""
        if self._stopping:
            return "the service is stopping"
        if self.is_ready():
            return None
        failed = [s for s in self._sessions if s.error]
        if failed:
            return f"its model failed to load: {public_message(failed[0].error or '')}"
        return "its model is loading" if self._sessions else "the service has no workers"

    @property
    def pending(self) -> int:
        return self._pending

    def snapshot(self) -> list[dict[str, Any]]:
        """One entry per session, shaped as a worker's (the gateway's pid: no process of its own)."""
        out = []
        for s in self._sessions:
            q = s.queue
            out.append(
                {
                    "id": s.index,
                    "remote": None,
                    "pid": os.getpid(),
                    "state": s.state,
                    "http_port": None,
                    "outstanding": q.outstanding if q is not None else 0,
                    "restarts": 0,
                    "providers": s.processor.providers_used,
                    "last_error": public_message(s.error) if s.error else None,
                    "runs": q.runs if q is not None else None,
                    "dropped": q.dropped if q is not None else None,
                }
            )
        return out


__all__ = ["ThreadService"]
