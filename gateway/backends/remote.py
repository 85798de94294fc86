"""Remote workers: worker processes on other hosts that join a service's pool.

A remote worker (``eas-gateway worker``, gateway.worker.agent) serves the same framed RPC
as a local one, on TCP, and registers with the gateway (``POST /api/v1/workers/<service>``,
gateway.fronts.routes.workers) with the service's ``remote_workers.token``; it repeats that
registration as its heartbeat. The gateway then connects to it (opening each connection
with the same token), pings it like a local worker, routes to it when it answers, and
publishes its HTTP port for direct calls. It is:

* ejected from routing after missed pings and admitted again when it answers;
* reconnected with back-off when its connection drops while it still heart-beats;
* removed once not heard from for ``remote_workers.ttl_s``, or at once when it
  deregisters (a clean stop).

The gateway never starts or kills a remote worker: its host's supervisor (systemd,
Kubernetes) does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time

from gateway.backends.supervision import (
    CONNECTIONS_PER_WORKER,
    CRASH_BACKOFF_S,
    EJECT_AFTER,
    Supervisor,
    Worker,
    WorkerState,
)
from gateway.codecs.ipc import IPCClient, IPCTimeout, WorkerConnectionError
from gateway.core.metadata import ModelMetadata
from gateway.core.tls import ClientTls, worker_link

log = logging.getLogger("gateway.pool")

# Longest wait between two connection attempts to a remote worker that still heart-beats.
MAX_RECONNECT_S = 2.0
# Connections replaced after a TLS reload, finishing their calls (held until they close).
_RETIRING: set[asyncio.Task[None]] = set()


class RemoteSupervision(Supervisor):
    """The remote half of a pool: registrations, heartbeats, connections, expiry."""

    def register_remote(
        self, worker_id: str, ipc: str, http_host: str, http_port: int, metadata: ModelMetadata | None
    ) -> bool:
        """A registration or a heartbeat; True when the worker is new to the pool."""
        now = time.monotonic()
        for w in self._workers:
            if w.remote_id == worker_id:
                w.seen_at = now
                if (w.socket_path, w.http_host, w.http_port) != (ipc, http_host, http_port):
                    # Same id at a new address (a restarted pod): reconnect there.
                    w.socket_path, w.http_host, w.http_port = ipc, http_host, http_port
                    w.lost.set()
                return False
        if metadata is not None and self.metadata is None:
            self.metadata = metadata
        i = max((w.index for w in self._workers), default=-1) + 1
        w = Worker(i, ipc, remote_id=worker_id, http_host=http_host, http_port=http_port, seen_at=now)
        self._workers.append(w)
        w.task = asyncio.create_task(self._supervise_remote(w), name=f"pool-{self.service.name}-remote-{i}")
        log.info("service %s: remote worker %s joined (%s)", self.service.name, worker_id, ipc)
        return True

    def deregister_remote(self, worker_id: str) -> bool:
        """A remote worker stopping cleanly: out of routing at once. False if unknown."""
        for w in self._workers:
            if w.remote_id == worker_id:
                w.seen_at = 0.0  # expired: its supervision removes it
                w.lost.set()
                return True
        return False

    def _worker_link(self) -> ClientTls | None:
        """The gateway's side of mTLS with its remote workers (``gateway.worker_tls``): its
        certificate, and the CA the workers' must chain to, as last loaded (SIGHUP)."""
        cfg = self.gateway.worker_tls
        return worker_link(cfg) if cfg is not None else None

    def _expired(self, w: Worker) -> bool:
        ttl = self.service.remote_workers.ttl_s if self.service.remote_workers else 0.0
        return time.monotonic() - w.seen_at > ttl

    async def _supervise_remote(self, w: Worker) -> None:
        attempts = 0
        try:
            while not self._stopping and not self._expired(w):
                link = self._worker_link()
                generation = link.generation if link is not None else 0
                if await self._connect_remote(w):
                    attempts = 0
                    self._set_state(w, WorkerState.READY)
                    await self._watch_remote(w, generation)
                    if w.client is not None:
                        w.client.close()
                        w.client = None
                    if self._stopping:
                        return
                    self._set_state(w, WorkerState.DOWN)
                else:
                    self._set_state(w, WorkerState.FAILED)
                attempts += 1
                delay = min(MAX_RECONNECT_S, CRASH_BACKOFF_S * 2 ** min(attempts, 10))
                w.retry_at = time.monotonic() + delay
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(w.lost.wait(), delay)
                w.retry_at = 0.0
        finally:
            if w.client is not None:
                w.client.close()
                w.client = None
            if not self._stopping and w in self._workers:
                self._workers.remove(w)
                self._set_state(w, WorkerState.STOPPED)
                log.warning(
                    "service %s: remote worker %s removed (%s)",
                    self.service.name, w.remote_id, w.last_error or "not heard from",
                )  # fmt: skip

    async def _dial(self, w: Worker, tls: ssl.SSLContext | None) -> IPCClient:
        """New connections to ``w``, proven by a first ping (the token was taken: a wrong one
        closes the connection). Raises what connecting or the ping raised."""
        assert self.service.remote_workers is not None

        def lost() -> None:  # only once they carry the worker's calls (a refused dial does not)
            if w.client is client:
                w.lost.set()

        client = IPCClient(
            w.socket_path,
            CONNECTIONS_PER_WORKER,
            on_lost=lost,
            key=self.service.remote_workers.token,
            tls=tls,
        )
        try:
            await asyncio.wait_for(client.connect(), max(1.0, self.gateway.health_interval_s * 2))
            w.last_stats = await client.ping(max(1.0, self.gateway.health_interval_s * 2))
        except BaseException:
            client.close()
            raise
        return client

    async def _connect_remote(self, w: Worker) -> bool:
        w.lost = asyncio.Event()
        link = self._worker_link()
        try:
            client = await self._dial(w, link.context if link is not None else None)
        except (OSError, asyncio.TimeoutError, IPCTimeout, WorkerConnectionError) as exc:
            w.last_error = f"cannot reach the remote worker ({type(exc).__name__})"
            return False
        w.client = client
        w.ready_since = time.monotonic()
        w.ever_ready = True
        w.last_error = None
        return True

    async def _watch_remote(self, w: Worker, generation: int) -> None:
        """Return when the connection is lost, the worker expired, or the pool stops.
        ``generation``: that of the TLS files the connections were made with; once they are
        loaded again (SIGHUP), new connections take over (:meth:`_renew`)."""
        assert w.client is not None and self._stop_event is not None
        interval = max(0.05, self.gateway.health_interval_s)
        link = self._worker_link()
        missed = 0
        refused = -1  # the generation whose files the worker refused (said once, tried each round)
        while not self._stopping:
            if link is not None and link.generation != generation:
                if await self._renew(w, link, quiet=link.generation == refused):
                    generation = link.generation
                else:
                    refused = link.generation
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(w.lost.wait(), interval)
            if w.lost.is_set():
                w.last_error = w.last_error or "connection lost"
                return
            if self._expired(w):
                w.last_error = "stopped heart-beating"
                return
            try:
                w.last_stats = await w.client.ping(max(1.0, 2 * interval))
            except IPCTimeout:
                missed += 1
                if missed >= EJECT_AFTER and w.state is WorkerState.READY:
                    log.warning("service %s: remote worker %s ejected", self.service.name, w.remote_id)
                    self._set_state(w, WorkerState.EJECTED)
                continue
            except WorkerConnectionError:
                w.last_error = "connection lost"
                return
            missed = 0
            if w.state is WorkerState.EJECTED:
                self._set_state(w, WorkerState.READY)

    async def _renew(self, w: Worker, link: ClientTls, quiet: bool) -> bool:
        """Connections made with the TLS files as loaded now take the worker's new calls; the
        old ones finish the calls they carry, then close. False, the old ones staying, when
        the worker does not take the new files (it has not loaded its own yet: tried again
        each round; ``quiet``: said already)."""
        assert w.client is not None
        try:
            client = await self._dial(w, link.context)
        except (OSError, asyncio.TimeoutError, IPCTimeout, WorkerConnectionError) as exc:
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "service %s: remote worker %s: no connection with the TLS files loaded again (%s);"
                " the connections made before stay in use",
                self.service.name, w.remote_id, type(exc).__name__,
            )  # fmt: skip
            return False
        old, w.client = w.client, client
        task = asyncio.create_task(old.retire(), name=f"pool-{self.service.name}-retire-{w.index}")
        _RETIRING.add(task)
        task.add_done_callback(_RETIRING.discard)
        log.info(
            "service %s: remote worker %s: connected with the TLS files loaded again",
            self.service.name, w.remote_id,
        )  # fmt: skip
        return True


__all__ = ["MAX_RECONNECT_S", "RemoteSupervision"]
