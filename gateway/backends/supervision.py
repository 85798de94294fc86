"""Supervision of one service's worker processes: start, watch, restart with back-off.

* A worker is a fresh interpreter (``python -m gateway.worker.main``: spawn semantics,
  without multiprocessing's resource tracker or re-import of ``__main__``) that takes
  traffic only once it reports ready over a socketpair; the readiness carries the
  processor's model metadata.
* Health: process exit (a pidfd, and EOF on the socketpair: noticed at once), a lost RPC
  connection, and a ping every ``health_interval_s``: two missed pings eject the worker
  from routing until a ping succeeds again; a worker ejected for ``HANG_KILL_S`` is killed
  and restarted. A pong that reports a problem (``unhealthy``: the compute thread died or
  one run stalled while requests wait) gets the worker restarted at once.
* Restarts back off exponentially per worker, doubling up to
  ``gateway.restart_backoff_max_s``: from 0.1 s after a crash of a worker that was ready,
  from 0.5 s after a failed start (a model that does not load will not load a moment later).
* The log says what failed once per change: a start failure is logged when its message
  differs from the service's last one, a recovery says how long the service was down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from multiprocessing.connection import Connection
from typing import Any

from gateway.backends.process import kill, pidfd, wait_exit, worker_env
from gateway.codecs.ipc import IPCClient, IPCTimeout, WorkerConnectionError
from gateway.config import GatewayConfig, ServiceConfig
from gateway.core.metadata import ModelMetadata

log = logging.getLogger("gateway.pool")

# First delay before restarting a worker that crashed after being ready, and one that failed
# to start; each further consecutive failure doubles it, up to restart_backoff_max_s.
CRASH_BACKOFF_S = 0.1
START_BACKOFF_S = 0.5
# A worker that stayed up this long is healthy again: its back-off starts over.
STABLE_S = 10.0
# Missed pings before a worker is taken out of routing.
EJECT_AFTER = 2
# An ejected worker that does not answer pings for this long is killed and restarted.
HANG_KILL_S = 30.0
CONNECTIONS_PER_WORKER = 2

# Absolute file paths in a load error: clients see only the file's name.
_PATH_RE = re.compile(r"(?<![\w.])/(?:[^\s/:'\"]+/)+([^\s/:'\"]+)")


def public_message(text: str) -> str:
    """A worker's error as a client may read it: directories of file paths removed."""
    return _PATH_RE.sub(r"\1", text)


def backoff_delay(failures: int, ever_ready: bool, cap: float) -> float:
    """Seconds before restart number ``failures`` (consecutive) of a worker."""
    base = CRASH_BACKOFF_S if ever_ready else START_BACKOFF_S
    return float(min(cap, base * 2 ** min(max(failures - 1, 0), 30)))


class WorkerState(str, Enum):
    """Where a worker is in its life; only READY workers take traffic."""

    STARTING = "starting"  # spawned, loading its processor
    READY = "ready"
    EJECTED = "ejected"  # missed pings: out of routing until it answers again
    DOWN = "down"  # gone (exit, lost connection, unhealthy); being torn down
    BACKOFF = "backoff"  # waiting to restart a worker that was ready before
    FAILED = "failed"  # never became ready; waiting to retry
    DRAINING = "draining"  # being removed (scale down): finishes its requests, takes no new ones
    STOPPED = "stopped"  # the pool is stopping


@dataclass(eq=False)
class Worker:
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
    # When the next restart is due (monotonic); 0 when none is waiting.
    retry_at: float = 0.0
    # Being removed: supervision must not put it back into routing.
    retiring: bool = False
    last_stats: dict[str, Any] = field(default_factory=dict)
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    # Our end of the readiness pipe; closing it (or our death) tells the worker to exit.
    conn: Any = None
    task: asyncio.Task[None] | None = None
    # The ONNX Runtime execution providers the worker really runs on (None: not onnx).
    providers: list[str] | None = None
    # A remote worker (gateway.backends.remote): its id, the host of its HTTP port, and when
    # it last registered (monotonic). None for the gateway's own worker processes.
    remote_id: str | None = None
    http_host: str | None = None
    seen_at: float = 0.0


class Supervisor:
    """Starts, watches and restarts workers; the pool (gateway.backends.pool) routes to them."""

    def __init__(self, service: ServiceConfig, gateway: GatewayConfig) -> None:
        self.service = service
        self.gateway = gateway
        self.restarts_total = 0
        # The model's inputs and outputs as the processor reported them in its workers'
        # readiness (the latest one); None until a worker has been ready.
        self.metadata: ModelMetadata | None = None
        self._workers: list[Worker] = []
        self._stopping = False
        self._stop_event: asyncio.Event | None = None
        self._ready_event: asyncio.Event | None = None
        # The last start failure logged for the service, and since when no worker was ready.
        self._logged_error: str | None = None
        self._down_since: float | None = None

    def _set_state(self, w: Worker, state: WorkerState) -> None:
        if w.retiring and state is WorkerState.READY:
            return  # a worker being removed never takes traffic again
        w.state = state
        assert self._ready_event is not None
        if any(x.state is WorkerState.READY for x in self._workers):
            self._ready_event.set()
        else:
            self._ready_event.clear()

    async def _supervise(self, w: Worker) -> None:
        assert self._stop_event is not None
        while not self._stopping and not w.retiring:
            started = time.monotonic()
            ready = False
            try:
                ready = await self._start_worker(w)
                if ready:
                    self._set_state(w, WorkerState.READY)
                    await self._watch(w)
                elif not (self._stopping or w.retiring):  # a start cut short by a stop is no failure
                    self._report_start_failure(w, time.monotonic() - started)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let one surprise end supervision of this worker
                log.exception("service %s: worker %d supervision error", self.service.name, w.index)
                w.last_error = f"supervisor error: {type(exc).__name__}"
            if self._stopping or w.retiring:
                return
            uptime = time.monotonic() - started
            self._set_state(w, WorkerState.DOWN)
            await self._teardown(w)
            if ready and uptime >= STABLE_S:
                w.failures = 0
            w.failures += 1
            delay = backoff_delay(w.failures, w.ever_ready, self.gateway.restart_backoff_max_s)
            self._set_state(w, WorkerState.BACKOFF if w.ever_ready or ready else WorkerState.FAILED)
            if ready:
                log.warning(
                    "service %s: worker %d went down after %.1f s (%s); restart in %.1f s",
                    self.service.name, w.index, uptime, w.last_error or "exited", delay,
                )  # fmt: skip
            if not self._ready_event_set() and self._down_since is None:
                self._down_since = time.monotonic()
            w.retry_at = time.monotonic() + delay
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop_event.wait(), delay)
            w.retry_at = 0.0
            if self._stopping or w.retiring:
                return
            w.restarts += 1
            self.restarts_total += 1

    def _ready_event_set(self) -> bool:
        return self._ready_event is not None and self._ready_event.is_set()

    def _report_start_failure(self, w: Worker, took: float) -> None:
        """Log a failed start once per distinct error (repeats are DEBUG)."""
        error = w.last_error or "failed to start"
        level = logging.DEBUG if error == self._logged_error else logging.ERROR
        self._logged_error = error
        nxt = backoff_delay(w.failures + 1, w.ever_ready, self.gateway.restart_backoff_max_s)
        log.log(
            level,
            "service %s: worker %d failed to start after %.2f s: %s (attempt %d; next in %.1f s, "
            "backing off up to %g s)",
            self.service.name, w.index, took, error, w.failures + 1, nxt, self.gateway.restart_backoff_max_s,
        )  # fmt: skip

    async def _start_worker(self, w: Worker) -> bool:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        parent, child_fd = Connection(a.detach()), b.detach()
        self._set_state(w, WorkerState.STARTING)
        w.lost = asyncio.Event()
        w.pid, w.http_port, w.client, w.last_stats = None, None, None, {}
        try:
            # Popen returns once the child is forked and exec'd (milliseconds).
            w.process = subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-m", "gateway.worker.main", str(child_fd)],
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
        # A failed load is logged in full (with its traceback) by the worker on a first
        # attempt only; the pool reports every change of error itself.
        parent.send((self.service, self.gateway, w.index, w.socket_path, w.failures == 0))
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
        w.providers = msg.get("providers")
        metadata = msg.get("metadata")
        if isinstance(metadata, ModelMetadata):
            self.metadata = metadata
        w.ready_since = time.monotonic()
        w.ever_ready = True
        w.last_error = None
        if self._down_since is not None:
            log.info(
                "service %s: ready again after %.1f s without a ready worker",
                self.service.name, w.ready_since - self._down_since,
            )  # fmt: skip
            self._down_since = None
        self._logged_error = None
        name = self.service.name
        log.info("service %s: worker %d ready (pid %s, http port %s)", name, w.index, w.pid, w.http_port)
        return True

    async def _watch(self, w: Worker) -> None:
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

    async def _teardown(self, w: Worker) -> None:
        if w.client is not None:
            w.client.close()
            w.client = None
        close_conn(w)
        if w.process is not None:
            kill(w.process)
            await wait_exit(w.process, 5.0)
        with contextlib.suppress(OSError):
            os.unlink(w.socket_path)

    # --- why the service is not ready --------------------------------------------------

    def not_ready_reason(self) -> str | None:
        """None while a worker is ready; otherwise why not, as a client may read it."""
        if self._stopping:
            return "the service is stopping"
        ws = self._workers
        if any(w.state is WorkerState.READY for w in ws):
            return None
        if not ws:
            return "the service has no workers"
        failed = [w for w in ws if w.last_error]
        if failed:
            w = failed[0]
            what = "failed to start" if not w.ever_ready else "went down"
            reason = f"its workers {what}: {public_message(w.last_error or '')}"
            wait = self.retry_in()
            if w.state is WorkerState.STARTING:
                reason += f" (attempt {w.failures + 1} under way)"
            elif wait is not None:
                reason += f" ({w.failures} attempt(s); next in {wait:.1f} s)"
            return reason
        if any(w.state is WorkerState.EJECTED for w in ws):
            return "its workers stopped answering"
        return "its workers are starting"

    def retry_in(self) -> float | None:
        """Seconds until the next restart attempt of any worker; None when none waits."""
        due = [w.retry_at for w in self._workers if w.retry_at]
        if not due:
            return None
        return max(0.0, min(due) - time.monotonic())


def close_conn(w: Worker) -> None:
    if w.conn is not None:
        with contextlib.suppress(OSError):
            w.conn.close()
        w.conn = None


__all__ = ["Supervisor", "Worker", "WorkerState", "backoff_delay", "close_conn", "public_message"]
