"""WorkerPool: one service's worker processes (supervised by gateway.backends.supervision)
and the dispatch of requests to them.

* Dispatch picks the ready worker with the fewest outstanding requests; a connection
  failure is retried once on a different worker (predict is idempotent, and the first
  worker may have died before it saw the request); the service's pending limit gives
  PoolOverloaded (450); no ready worker gives NoReadyWorker (503) at once, naming why
  (a model that failed to load, workers starting), rather than queueing behind a restart;
  the timeout gives UpstreamTimeout (504) and sends a cancel frame, so a request still
  queued in the worker never runs.
* ``scale(n)`` adds workers, or drains the last ones (out of routing, their requests
  answered, then stopped) while the others keep serving.
* A service that may scale to zero (``autoscale``'s ``min_workers: 0``), scaled to zero
  while idle, starts a worker on its next call (one served by remote workers only waits for
  one to join); the calls that arrive until it is ready wait for it (within their timeout,
  at most ``autoscale.max_waiting`` of them; past that 503 at once), and their answers carry
  the wait as ``Server-Timing: cold-start;dur=<ms>``.
* Workers on other hosts join and leave by themselves (gateway.backends.remote) and are
  routed to like the pool's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import time
from typing import Any

from gateway.backends.process import kill, socket_dir, wait_exit
from gateway.backends.remote import RemoteSupervision
from gateway.backends.supervision import Worker, WorkerState, close_conn
from gateway.codecs.ipc import IPCTimeout, WorkerConnectionError
from gateway.config import GatewayConfig, ServiceConfig
from gateway.core import errors
from gateway.core.calls import WorkerRequest, WorkerResponse

log = logging.getLogger("gateway.pool")


class PoolOverloaded(errors.TooManyPending):
    """The service's pending limit (max_pending) is reached: EAS 450."""


class NoReadyWorker(errors.ServiceNotReady):
    """No worker of the service is ready: 503, answered at once."""


class UpstreamTimeout(errors.UpstreamTimeout):
    """The worker did not answer within the timeout: 504 (the upstream call is cancelled)."""


class WorkerPool(RemoteSupervision):
    """One per predict service: a ``ServiceBackend`` (gateway.core.backend) in full."""

    # Calls reach a worker encoded, in the processor's TF wire form.
    takes_tensors = False

    def __init__(self, service: ServiceConfig, gateway: GatewayConfig) -> None:
        super().__init__(service, gateway)
        self._pending = 0
        self._rr = 0
        self._drained: asyncio.Event | None = None
        self._dir: str | None = None
        self._waking = 0  # calls waiting for a worker to start from zero

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn every worker and return at once (see wait_ready)."""
        if self._dir is not None:
            return
        self._stop_event = asyncio.Event()
        self._ready_event = asyncio.Event()
        self._drained = asyncio.Event()
        self._dir = socket_dir()
        for _ in range(self.service.workers):
            self._add_worker()

    def _add_worker(self) -> Worker:
        assert self._dir is not None
        i = max((w.index for w in self._workers), default=-1) + 1
        w = Worker(i, os.path.join(self._dir, f"w{i}.sock"))
        self._workers.append(w)
        w.task = asyncio.create_task(self._supervise(w), name=f"pool-{self.service.name}-{i}")
        return w

    async def wait_ready(self, timeout: float) -> bool:
        """True as soon as one worker is ready; False after ``timeout``, or early once every
        worker has failed to load at least once (a broken model will not fix itself)."""
        assert self._ready_event is not None, "start() first"
        if self.service.workers == 0:
            return True  # served by remote workers only: they join when they are ready
        deadline = time.monotonic() + timeout
        while not self._ready_event.is_set():
            if self._asleep():
                return True  # scaled to zero: the next call starts a worker
            if self._workers and all(w.failures and not w.ever_ready for w in self._workers):
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ready_event.wait(), min(left, 0.1))
        return True

    async def wait_all_ready(self, timeout: float) -> bool:
        """True once every worker is ready; False after ``timeout`` or as soon as a worker has
        failed to start (a new version that does not load must not replace a working one)."""
        assert self._ready_event is not None, "start() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stopping:
            if all(w.state is WorkerState.READY for w in self._workers):
                return True
            if any(w.failures and not w.ever_ready for w in self._workers):
                return False
            await asyncio.sleep(0.05)
        return False

    async def scale(self, workers: int, drain_timeout: float) -> None:
        """Run ``workers`` workers: new ones start in the background (ready when they say so);
        surplus ones leave routing at once, answer what they hold, then stop."""
        # Remote ones come and go by themselves; draining ones are already on their way out.
        local = self._local()
        surplus = local[workers:] if workers < len(local) else []
        for _ in range(workers - len(local)):
            self._add_worker()
        for w in surplus:
            w.retiring = True
            self._set_state(w, WorkerState.DRAINING)
        await asyncio.gather(*(self._retire(w, drain_timeout) for w in surplus))

    def _local(self) -> list[Worker]:
        """The pool's own workers that are not leaving."""
        return [w for w in self._workers if w.remote_id is None and not w.retiring]

    async def _retire(self, w: Worker, drain_timeout: float) -> None:
        deadline = time.monotonic() + max(0.0, drain_timeout)
        # A counter, decremented by each dispatch as it returns: polled, not signalled.
        while w.outstanding and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if w.task is not None:
            w.task.cancel()
            await asyncio.gather(w.task, return_exceptions=True)
        if w.client is not None:
            w.client.close()
        if w.process is not None and w.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                w.process.send_signal(signal.SIGTERM)  # the worker finishes what it holds
            await wait_exit(w.process, 5.0)
            kill(w.process)
            await wait_exit(w.process, 2.0)
        close_conn(w)
        with contextlib.suppress(OSError):
            os.unlink(w.socket_path)
        if w in self._workers:
            self._workers.remove(w)
            self._set_state(w, WorkerState.STOPPED)
        log.info("service %s: worker %d removed", self.service.name, w.index)

    async def stop(self, drain_timeout: float) -> None:
        """Stop routing, let in-flight requests finish (bounded), then stop the processes."""
        if self._stopping:
            return
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()
        deadline = time.monotonic() + max(0.0, drain_timeout)
        if self._pending and self._drained is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained.wait(), max(0.0, drain_timeout))
        for w in self._workers:
            self._set_state(w, WorkerState.STOPPED)
            if w.client is not None:
                w.client.close()
            if w.process is not None and w.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    w.process.send_signal(signal.SIGTERM)
        for w in self._workers:
            if w.process is not None:
                await wait_exit(w.process, max(0.5, deadline - time.monotonic()))
                kill(w.process)
        tasks = [w.task for w in self._workers if w.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for w in self._workers:
            if w.process is not None:
                await wait_exit(w.process, 2.0)
            close_conn(w)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

        # --- dispatch --------------------------------------------------------------------

    def _pick(self, exclude: Worker | None) -> Worker | None:
        ws = self._workers
        n = len(ws)
        if not n:
            return None
        start = self._rr
        self._rr = (start + 1) % n
        best: Worker | None = None
        ready = WorkerState.READY
        for k in range(n):
            w = ws[(start + k) % n]
            if w.state is ready and w is not exclude and (best is None or w.outstanding < best.outstanding):
                best = w
        return best

    async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        if self._stopping:
            raise self._not_ready()
        if self._pending >= self.service.max_pending:
            raise PoolOverloaded(
                f"service {self.service.name} is busy: {self._pending} requests pending "
                f"(max_pending {self.service.max_pending})"
            )
        self._pending += 1
        try:
            loop = asyncio.get_running_loop()
            end = loop.time() + timeout
            deadline = time.monotonic() + timeout
            if not req.deadline or req.deadline > deadline:
                req.deadline = deadline
            cold = await self._wake(timeout) if self._cold() else 0.0
            failed: Worker | None = None
            for _attempt in range(2):
                w = self._pick(failed)
                if w is None or w.client is None:
                    break
                left = end - loop.time()
                if left <= 0:
                    raise UpstreamTimeout(
                        f"no answer from service {self.service.name} within {timeout:.3g} s"
                    )
                w.outstanding += 1
                try:
                    resp = await w.client.call(req, left)
                    if cold:
                        timing = f"cold-start;dur={cold * 1000:.1f}"
                        resp.headers = {**(resp.headers or {}), "Server-Timing": timing}
                    return resp
                except WorkerConnectionError:
                    # The worker died or is going away: out of routing now, try another one.
                    if w.state is WorkerState.READY:
                        self._set_state(w, WorkerState.DOWN)
                    failed = w
                except IPCTimeout:
                    raise UpstreamTimeout(self._timeout_message(timeout)) from None
                finally:
                    w.outstanding -= 1
            raise self._not_ready()
        finally:
            self._pending -= 1
            if self._stopping and self._pending == 0 and self._drained is not None:
                self._drained.set()

    def _to_zero(self) -> bool:
        """Whether the service may be scaled to zero workers (its own or a scheduled bound)."""
        auto = self.service.autoscale
        return auto is not None and (auto.min_workers == 0 or any(e.min_workers == 0 for e in auto.schedule))

    def _remote_only(self) -> bool:
        return self.service.workers == 0 and self.service.remote_workers is not None

    def _asleep(self) -> bool:
        """Scaled to zero: no worker at all, the next call waits for one (a remote-only
        service's from the orchestrator following ``easgw_desired_workers``)."""
        return (
            self._to_zero()
            and not self._local()
            and not any(w.state is WorkerState.READY for w in self._workers)
        )

    def _cold(self) -> bool:
        """A pool that may scale to zero, with no ready worker and its own workers, if any, all
        starting for the first time (scaled to zero, or woken from it): a call waits for one.
        A worker restarting after a failure is answered 503 at once, as in any pool."""
        if not self._to_zero() or any(w.state is WorkerState.READY for w in self._workers):
            return False
        return all(w.state is WorkerState.STARTING and not w.failures for w in self._local())

    async def _wake(self, timeout: float) -> float:
        """Start a worker if none is starting and wait until one is ready, within the call's
        ``timeout``; -> the seconds waited."""
        assert self.service.autoscale is not None and self._ready_event is not None
        name, bound = self.service.name, self.service.autoscale.max_waiting
        if self._waking >= bound:
            raise NoReadyWorker(
                f"service {name} is starting a worker from zero: {self._waking} calls already wait "
                f"for it (autoscale.max_waiting {bound})",
                1,
            )
        if not self._local() and not self._remote_only():
            log.info("service %s: a call arrived with no worker running: starting one", name)
            self._add_worker()
        self._waking += 1
        t0 = time.monotonic()
        try:
            while not self._ready_event.is_set():
                local = self._local()
                if self._stopping or any(w.failures and not w.ever_ready for w in local):
                    raise self._not_ready()
                left = t0 + timeout - time.monotonic()
                if left <= 0:
                    raise UpstreamTimeout(f"no worker of service {name} started within {timeout:.3g} s")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._ready_event.wait(), min(left, 0.1))
        finally:
            self._waking -= 1
        return time.monotonic() - t0

    def _not_ready(self) -> NoReadyWorker:
        """503 naming why no worker takes the call; Retry-After: when the next start is due."""
        reason = self.not_ready_reason() or "it has no ready worker"
        wait = self.retry_in()
        retry_after = max(1, math.ceil(wait)) if wait is not None else 1
        return NoReadyWorker(f"service {self.service.name} is not ready: {reason}", retry_after)

    def _timeout_message(self, timeout: float) -> str:
        return f"no answer from service {self.service.name} within {timeout:.3g} s"

    # --- figures -----------------------------------------------------------------------

    def is_ready(self) -> bool:
        """A worker is ready and the pool is not stopping (``not_ready_reason`` says why not)."""
        if self._stopping:
            return False
        # Scaled to zero: the next call starts a worker and waits for it.
        return any(w.state is WorkerState.READY for w in self._workers) or self._asleep()

    @property
    def pending(self) -> int:
        return self._pending

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {
                "id": w.index,
                "remote": w.remote_id and w.socket_path,
                "pid": w.pid,
                "state": w.state.value,
                "http_port": w.http_port,
                "outstanding": w.outstanding,
                "restarts": w.restarts,
                "providers": w.providers,
                "last_error": w.last_error,
                # Counters from the worker's last health ping (None before the first one).
                "runs": w.last_stats.get("runs"),
                "dropped": w.last_stats.get("dropped"),
            }
            for w in self._workers
        ]

    def ready_endpoints(self) -> list[tuple[str, int]]:
        host = self.gateway.advertised_worker_host
        return [
            (w.http_host or host, w.http_port)
            for w in self._workers
            if w.state is WorkerState.READY and w.http_port
        ]

    async def worker_stats(self, index: int, timeout: float = 2.0) -> dict[str, Any]:
        """Counters of one worker (runs, dropped, outstanding, pid), fetched by a ping."""
        w = self._workers[index]
        if w.client is None:
            raise NoReadyWorker(f"worker {index} is not running")
        return await w.client.ping(timeout)
