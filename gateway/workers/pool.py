"""WorkerPool: supervises one service's worker processes and dispatches requests to them.

* Workers are fresh interpreters (``python -m gateway.workers.main``: spawn semantics,
  without multiprocessing's resource tracker or re-import of ``__main__``) and take traffic
  only once they report ready; each is reached over a pipelined unix-socket RPC
  (gateway.workers.ipc). Configuration and readiness travel over a socketpair; the
  readiness carries the processor's model metadata, kept as :attr:`WorkerPool.metadata`.
* Health: process exit (a pidfd, and EOF on the socketpair: noticed at once), a lost RPC connection
  (removed from routing at once), and a ping every ``health_interval_s``: two missed
  pings eject the worker from routing until a ping succeeds again (a hung or stopped
  worker must not take traffic); a worker ejected for ``HANG_KILL_S`` is killed and
  restarted. A worker whose pong reports a problem (``unhealthy``: its compute thread
  died, or one run has stalled while requests wait, gateway.workers.compute) is restarted
  at once.
* Restarts use exponential back-off per worker (0.1 s after a first crash, then up to
  5 s), so a model that never loads restarts at most once per 5 s instead of spinning.
* Dispatch picks the ready worker with the fewest outstanding requests; a connection
  failure is retried once on a different worker (predict is idempotent, and the first
  worker may have died before it saw the request); the service's pending limit gives
  PoolOverloaded (450); no ready worker gives NoReadyWorker (503) at once, rather than
  queueing behind a restart; the timeout gives UpstreamTimeout (504) and sends a cancel
  frame, so a request still queued in the worker never runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from multiprocessing.connection import Connection
from typing import Any

from gateway import errors
from gateway.config import GatewayConfig, ServiceConfig
from gateway.workers.ipc import IPCClient, IPCTimeout, WorkerConnectionError, WorkerRequest, WorkerResponse
from gateway.workers.metadata import ModelMetadata
from gateway.workers.process import kill, pidfd, socket_dir, wait_exit, worker_env

log = logging.getLogger("gateway.pool")

# Back-off before restart number n (n = consecutive failures); the last value repeats.
BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
# A worker that stayed up this long is healthy again: its back-off starts over.
STABLE_S = 10.0
# Missed pings before a worker is taken out of routing.
EJECT_AFTER = 2
# An ejected worker that does not answer pings for this long is killed and restarted.
HANG_KILL_S = 30.0
CONNECTIONS_PER_WORKER = 2


class PoolOverloaded(errors.TooManyPending):
    """The service's pending limit (max_pending) is reached: EAS 450."""


class NoReadyWorker(errors.ServiceNotReady):
    """No worker of the service is ready: 503, answered at once."""


class UpstreamTimeout(errors.UpstreamTimeout):
    """The worker did not answer within the timeout: 504 (the upstream call is cancelled)."""


class WorkerState(str, Enum):
    """Where a worker is in its life; only READY workers take traffic."""

    STARTING = "starting"  # spawned, loading its processor
    READY = "ready"
    EJECTED = "ejected"  # missed pings: out of routing until it answers again
    DOWN = "down"  # gone (exit, lost connection, unhealthy); being torn down
    BACKOFF = "backoff"  # waiting to restart a worker that was ready before
    FAILED = "failed"  # never became ready; waiting to retry
    STOPPED = "stopped"  # the pool is stopping


@dataclass(eq=False)
class _Worker:
    index: int
    socket_path: str
    state: WorkerState = WorkerState.STARTING
    process: subprocess.Popen[bytes] | None = None
    pid: int | None = None
    http_port: int | None = None
    client: IPCClient | None = None
    outstanding: int = 0
    restarts: int = 0
    failures: int = 0
    last_error: str | None = None
    ready_since: float = 0.0
    ever_ready: bool = False
    last_stats: dict[str, Any] = field(default_factory=dict)
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    # Our end of the readiness pipe; closing it (or our death) tells the worker to exit.
    conn: Any = None


class WorkerPool:
    """One per predict service; see docs/architecture.md for the contract."""

    def __init__(self, service: ServiceConfig, gateway: GatewayConfig) -> None:
        self.service = service
        self.gateway = gateway
        self.restarts_total = 0
        # The model's inputs and outputs as the processor reported them in its workers'
        # readiness (the latest one); None until a worker has been ready.
        self.metadata: ModelMetadata | None = None
        self._workers: list[_Worker] = []
        self._pending = 0
        self._rr = 0
        self._stopping = False
        self._stop_event: asyncio.Event | None = None
        self._ready_event: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._dir: str | None = None

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn every worker and return at once (see wait_ready)."""
        if self._tasks:
            return
        self._stop_event = asyncio.Event()
        self._ready_event = asyncio.Event()
        self._drained = asyncio.Event()
        self._dir = socket_dir()
        for i in range(self.service.workers):
            w = _Worker(i, os.path.join(self._dir, f"w{i}.sock"))
            self._workers.append(w)
            self._tasks.append(asyncio.create_task(self._supervise(w), name=f"pool-{self.service.name}-{i}"))

    async def wait_ready(self, timeout: float) -> bool:
        """True as soon as one worker is ready; False after ``timeout``, or early once every
        worker has failed to load at least once (a broken model will not fix itself)."""
        assert self._ready_event is not None, "start() first"
        deadline = time.monotonic() + timeout
        while not self._ready_event.is_set():
            if self._workers and all(w.failures and not w.ever_ready for w in self._workers):
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ready_event.wait(), min(left, 0.1))
        return True

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
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self._workers:
            if w.process is not None:
                await wait_exit(w.process, 2.0)
            _close_conn(w)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    # --- supervision -----------------------------------------------------------------

    def _set_state(self, w: _Worker, state: WorkerState) -> None:
        w.state = state
        assert self._ready_event is not None
        if any(x.state is WorkerState.READY for x in self._workers):
            self._ready_event.set()
        else:
            self._ready_event.clear()

    async def _supervise(self, w: _Worker) -> None:
        assert self._stop_event is not None
        while not self._stopping:
            started = time.monotonic()
            ready = False
            try:
                ready = await self._start_worker(w)
                if ready:
                    self._set_state(w, WorkerState.READY)
                    await self._watch(w)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let one surprise end supervision of this worker
                log.exception("service %s: worker %d supervision error", self.service.name, w.index)
                w.last_error = f"supervisor error: {type(exc).__name__}"
            if self._stopping:
                return
            uptime = time.monotonic() - started
            self._set_state(w, WorkerState.DOWN)
            await self._teardown(w)
            if ready and uptime >= STABLE_S:
                w.failures = 0
            w.failures += 1
            delay = BACKOFF_S[min(w.failures, len(BACKOFF_S)) - 1]
            self._set_state(w, WorkerState.BACKOFF if w.ever_ready or ready else WorkerState.FAILED)
            log.warning(
                "service %s: worker %d is down (%s); restart in %.1f s",
                self.service.name, w.index, w.last_error or "exited", delay,
            )  # fmt: skip
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop_event.wait(), delay)
            if self._stopping:
                return
            w.restarts += 1
            self.restarts_total += 1

    async def _start_worker(self, w: _Worker) -> bool:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        parent, child_fd = Connection(a.detach()), b.detach()
        self._set_state(w, WorkerState.STARTING)
        w.lost = asyncio.Event()
        w.pid, w.http_port, w.client, w.last_stats = None, None, None, {}
        try:
            # Popen returns once the child is forked and exec'd (milliseconds).
            w.process = subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-m", "gateway.workers.main", str(child_fd)],
                pass_fds=(child_fd,),
                env=worker_env(self.service),
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            parent.close()
            w.last_error = f"cannot start a worker process: {exc.strerror}"
            return False
        finally:
            os.close(child_fd)
        w.pid = w.process.pid
        w.conn = parent
        parent.send((self.service, self.gateway, w.index, w.socket_path))
        msg_fut: asyncio.Future[Any] = loop.create_future()

        fd = parent.fileno()

        def on_msg() -> None:
            loop.remove_reader(fd)
            try:
                msg = parent.recv()
            except (EOFError, OSError) as exc:
                msg = {"ok": False, "error": f"worker exited during start ({type(exc).__name__})"}
            if not msg_fut.done():
                msg_fut.set_result(msg)

        loop.add_reader(fd, on_msg)
        try:
            msg = await asyncio.wait_for(msg_fut, self.gateway.worker_start_timeout_s)
        except asyncio.TimeoutError:
            msg = {"ok": False, "error": f"not ready within {self.gateway.worker_start_timeout_s:g} s"}
        finally:
            # Always, before the pipe can be closed: a reader left on its fd would fire on
            # whatever file reuses the number, in a loop, stalling the gateway.
            loop.remove_reader(fd)
        if not msg.get("ok"):
            w.last_error = str(msg.get("error") or "failed to start")[:300]
            return False
        client = IPCClient(w.socket_path, CONNECTIONS_PER_WORKER, on_lost=w.lost.set)
        try:
            await client.connect()
        except OSError as exc:
            client.close()
            w.last_error = f"cannot connect to the worker socket: {exc.strerror}"
            return False
        w.client = client
        w.http_port = int(msg["http_port"])
        metadata = msg.get("metadata")
        if isinstance(metadata, ModelMetadata):
            self.metadata = metadata
        w.ready_since = time.monotonic()
        w.ever_ready = True
        w.last_error = None
        log.info(
            "service %s: worker %d ready (pid %s, http port %s)",
            self.service.name,
            w.index,
            w.pid,
            w.http_port,
        )
        return True

    async def _watch(self, w: _Worker) -> None:
        """Return when the worker must be restarted (or the pool stops)."""
        assert self._stop_event is not None and w.client is not None and w.process is not None
        loop = asyncio.get_running_loop()
        exited = loop.create_future()

        def on_exit() -> None:
            if not exited.done():
                exited.set_result(None)

        # EOF on the socketpair (the worker sends nothing after readiness) and, where the
        # kernel has it, a pidfd: both become readable the moment the process dies.
        watched = [w.conn.fileno()]
        pfd = pidfd(w.process.pid)
        if pfd is not None:
            watched.append(pfd)
        for fd in watched:
            loop.add_reader(fd, on_exit)
        interval = max(0.05, self.gateway.health_interval_s)
        ping_timeout = max(1.0, 2 * interval)
        missed = 0
        ejected_at = 0.0
        stop_wait = asyncio.ensure_future(self._stop_event.wait())
        lost_wait = asyncio.ensure_future(w.lost.wait())
        try:
            while True:
                done, _ = await asyncio.wait({exited, stop_wait, lost_wait}, timeout=interval)
                if stop_wait in done:
                    return
                if exited in done or w.process.poll() is not None:
                    await wait_exit(w.process, 1.0)
                    w.last_error = f"exited with code {w.process.returncode}"
                    return
                if lost_wait in done:
                    w.last_error = "connection lost"
                    return
                try:
                    w.last_stats = await w.client.ping(ping_timeout)
                except IPCTimeout:
                    missed += 1
                except WorkerConnectionError:
                    w.last_error = "connection lost"
                    return
                else:
                    missed = 0
                    problem = w.last_stats.get("unhealthy")
                    if problem:
                        # The event loop answers pings; the compute side cannot serve.
                        w.last_error = f"unhealthy: {problem}"[:300]
                        return
                    if w.state is WorkerState.EJECTED:
                        log.info("service %s: worker %d answers again", self.service.name, w.index)
                        self._set_state(w, WorkerState.READY)
                    continue
                if missed >= EJECT_AFTER and w.state is WorkerState.READY:
                    log.warning(
                        "service %s: worker %d stopped answering; ejected", self.service.name, w.index
                    )
                    ejected_at = time.monotonic()
                    self._set_state(w, WorkerState.EJECTED)
                if w.state is WorkerState.EJECTED and time.monotonic() - ejected_at > HANG_KILL_S:
                    w.last_error = f"hung for {HANG_KILL_S:g} s"
                    return
        finally:
            for fd in watched:
                loop.remove_reader(fd)
            if pfd is not None:
                os.close(pfd)
            stop_wait.cancel()
            lost_wait.cancel()

    async def _teardown(self, w: _Worker) -> None:
        if w.client is not None:
            w.client.close()
            w.client = None
        _close_conn(w)
        if w.process is not None:
            kill(w.process)
            await wait_exit(w.process, 5.0)
        with contextlib.suppress(OSError):
            os.unlink(w.socket_path)

    # --- dispatch --------------------------------------------------------------------

    def _pick(self, exclude: _Worker | None) -> _Worker | None:
        ws = self._workers
        n = len(ws)
        if not n:
            return None
        start = self._rr
        self._rr = (start + 1) % n
        best: _Worker | None = None
        ready = WorkerState.READY
        for k in range(n):
            w = ws[(start + k) % n]
            if w.state is ready and w is not exclude and (best is None or w.outstanding < best.outstanding):
                best = w
        return best

    async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        if self._stopping:
            raise NoReadyWorker(f"service {self.service.name} is stopping")
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
            failed: _Worker | None = None
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
                    return await w.client.call(req, left)
                except WorkerConnectionError:
                    # The worker died or is going away: out of routing now, try another one.
                    if w.state is WorkerState.READY:
                        self._set_state(w, WorkerState.DOWN)
                    failed = w
                except IPCTimeout:
                    raise UpstreamTimeout(self._timeout_message(timeout)) from None
                finally:
                    w.outstanding -= 1
            raise NoReadyWorker(f"service {self.service.name} has no ready worker")
        finally:
            self._pending -= 1
            if self._stopping and self._pending == 0 and self._drained is not None:
                self._drained.set()

    def _timeout_message(self, timeout: float) -> str:
        return f"no answer from service {self.service.name} within {timeout:.3g} s"

    # --- figures -----------------------------------------------------------------------

    @property
    def pending(self) -> int:
        return self._pending

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {
                "id": w.index,
                "pid": w.pid,
                "state": w.state.value,
                "http_port": w.http_port,
                "outstanding": w.outstanding,
                "restarts": w.restarts,
                "last_error": w.last_error,
                # Counters from the worker's last health ping (None before the first one).
                "runs": w.last_stats.get("runs"),
                "dropped": w.last_stats.get("dropped"),
            }
            for w in self._workers
        ]

    def ready_endpoints(self) -> list[tuple[str, int]]:
        host = self.gateway.advertised_worker_host
        return [(host, w.http_port) for w in self._workers if w.state is WorkerState.READY and w.http_port]

    async def worker_stats(self, index: int, timeout: float = 2.0) -> dict[str, Any]:
        """Counters of one worker (runs, dropped, outstanding, pid), fetched by a ping."""
        w = self._workers[index]
        if w.client is None:
            raise NoReadyWorker(f"worker {index} is not running")
        return await w.client.ping(timeout)


def _close_conn(w: _Worker) -> None:
    if w.conn is not None:
        with contextlib.suppress(OSError):
            w.conn.close()
        w.conn = None
