"""QueueManager: every queue of the gateway over one durable store (docs/architecture.md).

Queue names: a service with ``processor: queue`` is the queue "<name>"; an
asynchronous service (``async: true``) has "<name>" (input) and "<name>/sink".
The embedded store lives in ``<data_dir>/queues.sqlite3``; a queue whose config names a
Redis URL (``queue.backend``) lives in that Redis (one ``RedisBackend`` per URL). Several
gateways may share a Redis: the holder of its owner lease (lease.py) serves its queues,
the others forward their calls there (proxy.py) and take over when the lease expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web

from eas_sdk._core import constants as C
from gateway.config import Config, QueueConfig, ServiceConfig
from gateway.lean_http import FastRequest, Query, Reply
from gateway.queue.backend import Backend, MemoryBackend
from gateway.queue.datadir import open_store
from gateway.queue.groups_admin import Sweeper
from gateway.queue.http import handle_http
from gateway.queue.proxy import FORWARDED, Forwarder, unavailable
from gateway.queue.records import Consumer, QueueError
from gateway.queue.replies import error_reply, error_response, to_response
from gateway.queue.sqlite import SqliteBackend
from gateway.queue.store import Queue
from gateway.queue.ws import handle_watch, watch_params

if TYPE_CHECKING:  # redis-py is an extra (easkit[redis]): imported only when a queue uses it
    from gateway.queue.lease import Lease
    from gateway.queue.redis_backend import RedisBackend

DB_FILE = "queues.sqlite3"
log = logging.getLogger(__name__)


def _redis_backend(url: str, fsync: str) -> RedisBackend:
    try:
        from gateway.queue.redis_backend import RedisBackend
    except ImportError:
        raise RuntimeError(
            "a queue backend names a Redis URL: that needs redis-py (pip install 'easkit[redis]')"
        ) from None
    return RedisBackend(url, fsync=fsync)


def queue_names(service: ServiceConfig) -> list[str]:
    if service.processor == "queue":
        return [service.name]
    if service.async_:
        return [service.name, f"{service.name}/{C.SINK_SUFFIX}"]
    return []


class QueueManager:
    def __init__(
        self,
        config: Config | Iterable[ServiceConfig],
        data_dir: str | None = None,
        *,
        backend: Backend | None = None,
    ) -> None:
        services = config.services if isinstance(config, Config) else tuple(config)
        if data_dir is None and isinstance(config, Config):
            data_dir = config.gateway.data_dir
        self.services: dict[str, ServiceConfig] = {}
        self.configs: dict[str, QueueConfig] = {}
        for svc in services:
            for name in queue_names(svc):
                self.services[name] = svc
                self.configs[name] = svc.queue
        # One backend per store: the embedded SQLite one and one per Redis URL. ``backend``
        # (tests) replaces them all. fsync "always" on one queue applies to its whole store.
        kinds = {
            name: ("sqlite" if backend is not None else cfg.backend) for name, cfg in self.configs.items()
        }
        self.backends: dict[str, Backend] = {}
        for kind in dict.fromkeys(kinds.values()):
            same = [self.configs[n] for n, k in kinds.items() if k == kind]
            fsync = "always" if any(c.fsync == "always" for c in same) else "normal"
            if backend is not None:
                self.backends[kind] = backend
            elif kind != "sqlite":
                self.backends[kind] = _redis_backend(kind, fsync)
            else:
                if data_dir is None:
                    self.backends[kind] = SqliteBackend(":memory:", fsync=fsync)
                else:  # locked, and checked for a store that went missing or is damaged
                    self.backends[kind] = open_store(data_dir, DB_FILE, fsync)
        self.queue_backends: dict[str, Backend] = {n: self.backends[k] for n, k in kinds.items()}
        # Each Redis store's owner lease; its queues are in self.queues only while it is held.
        self.leases: dict[str, Lease] = {}
        # Called after queues arrived or left (a lease gained or lost): the dispatchers follow.
        self.listeners: list[Callable[[], Awaitable[None]]] = []
        self.forwarder = Forwarder()
        # The main store: what the service listing and the store's tests look at.
        self.backend: Backend = next(iter(self.backends.values()), backend or MemoryBackend())
        self.backend_name = self.backend.name
        self.queues: dict[str, Queue] = {}
        self.watchers: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()
        self._visible: dict[str, asyncio.Future[None]] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        self._started = False
        self.closing = False
        # Async services' dispatchers (service name -> Dispatcher), registered by
        # gateway.queue.dispatcher.dispatchers: their figures join the snapshot.
        self.dispatchers: dict[str, Any] = {}
        # Deletes consumer groups idle for longer than their queue's group_idle_ttl_s.
        ttls = [c.group_idle_ttl_s for c in self.configs.values()]
        self.sweeper = Sweeper(lambda: self.queues.values(), ttls)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._started:
            return
        for kind, b in self.backends.items():
            if b.shared:  # several gateways on one store: its queues are served by the lease holder
                self.leases[kind] = await self._lease(b)  # type: ignore[arg-type]
            else:
                recovered = await asyncio.to_thread(b.recover)
                for name in self._names_of(b):
                    self._install(name, b, recovered.get(name))
                b.start(asyncio.get_running_loop())
        for lease in self.leases.values():
            await lease.claim()  # free (or ours): served here from now on
            lease.start()
        self.sweeper.start()
        self._started = True

    async def _lease(self, b: RedisBackend) -> Lease:
        from gateway.queue.lease import Lease

        await b.check_persistence()
        ttl = min(self.configs[n].owner_lease_s for n in self._names_of(b))
        lease = Lease(
            b.lease_client(ttl), b.key_prefix_key("owner"), ttl, lambda: self._gain(b), lambda: self._lose(b)
        )
        b.fence = lease
        return lease

    def _names_of(self, b: Backend) -> list[str]:
        return [n for n, qb in self.queue_backends.items() if qb is b]

    def _install(self, name: str, b: Backend, state: dict[str, Any] | None) -> None:
        q = Queue(name, self.configs[name], b)
        if state is not None:
            q.load(state)
        q.on_visible = lambda n=name: self._notify_visible(n)
        self.queues[name] = q

    async def _gain(self, b: RedisBackend) -> None:
        """This gateway took the store's lease: load its queues (what was delivered but not
        committed under the previous owner is delivered again)."""
        names = self._names_of(b)
        recovered = await b.recover_async(names)
        b.start(asyncio.get_running_loop())
        for name in names:
            self._install(name, b, recovered.get(name))
        await self._changed()

    async def _lose(self, b: RedisBackend) -> None:
        """Another gateway serves the store now: drop its queues here; watchers reconnect
        (through this gateway they are relayed to the new owner)."""
        for name in self._names_of(b):
            self.queues.pop(name, None)
            self._notify_visible(name)
        await self._changed()
        closing = [
            ws.close(code=1012, message=b"queue moved to another gateway") for ws in list(self.watchers)
        ]
        if closing:
            await asyncio.gather(*closing, return_exceptions=True)

    async def _changed(self) -> None:
        for listener in list(self.listeners):
            try:
                await listener()
            except Exception:
                log.exception("a queue listener failed")

    def advertise(self, host: str, port: int) -> None:
        """Where other gateways on the same Redis reach this one (call once listening)."""
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        for lease in self.leases.values():
            lease.advertise(address)

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        for t in list(self._timers):
            t.cancel()
        self._timers.clear()
        await self.sweeper.stop()
        await self.shutdown()
        for lease in self.leases.values():
            await lease.pause()  # no more rounds; still held while the last writes go out
        for b in self.backends.values():
            next_idx = {name: q.next_idx for name, q in self.queues.items() if q.backend is b}
            await b.aclose(next_idx)
        for lease in self.leases.values():
            await lease.stop()  # given back: another gateway takes over at once
        await self.forwarder.close()

    async def shutdown(self) -> None:
        """End long-lived requests: pending long-poll gets answer now (empty) and every
        watch is closed with 1001 (clients reconnect elsewhere); bounded to about 3 s.

        Call it from the application's on_shutdown: aiohttp waits for open handlers
        (a watch never ends by itself) before it runs cleanup contexts."""
        self.closing = True
        for fut in self._visible.values():
            if not fut.done():
                fut.set_result(None)
        closing = [
            asyncio.ensure_future(ws.close(code=1001, message=b"gateway shutting down"))
            for ws in list(self.watchers)
        ]
        if closing:  # all at once, bounded: a peer that never answers the close frame cannot stall the stop
            _done, pending = await asyncio.wait(closing, timeout=3.0)
            for t in pending:
                t.cancel()
            for t in closing:
                with contextlib.suppress(BaseException):
                    await t

    # ------------------------------------------------------------------ seam
    def has(self, name: str) -> bool:
        return name in self.configs

    def queue(self, name: str) -> Queue:
        return self.queues[name]

    def service_for(self, name: str) -> ServiceConfig | None:
        return self.services.get(name)

    async def handle(self, request: web.Request, queue_name: str) -> web.StreamResponse:
        q = self.queues.get(queue_name)
        watch = request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket"
        if q is None:
            if queue_name not in self.configs:
                return web.Response(status=404, text=f"queue {queue_name!r} not found")
            try:
                owner = self._owner(queue_name, request.headers)
            except QueueError as err:
                return error_response(err)
            if watch:
                try:
                    watch_params(self.configs[queue_name], request)  # refused here, naming the parameter
                except QueueError as err:
                    return error_response(err)
                return await self.forwarder.watch(owner, request)
            body = await request.read()
            try:
                reply = await self.forwarder.call(
                    owner, request.method, request.raw_path, request.headers, body
                )
            except QueueError as err:
                return error_response(err)
            return to_response(reply)
        if watch:
            return await handle_watch(self, q, request)
        return await handle_http(self, q, request)

    def _owner(self, queue_name: str, headers: Any) -> str:
        """The address of the gateway serving a queue this one does not (else a 503 to retry)."""
        lease = self.leases.get(self.configs[queue_name].backend)
        if lease is None or lease.owned:
            raise unavailable(None, "loading")
        if headers.get(FORWARDED):
            raise unavailable(None, "its serving gateway changed")
        if not lease.owner_address or lease.owner_address == "-":
            raise unavailable(None, "no gateway serves it yet")
        return lease.owner_address

    async def forward(self, queue_name: str, req: FastRequest, query: Query) -> Reply:
        """A plain call from the lean front for a queue another gateway serves."""
        try:
            owner = self._owner(queue_name, req.headers)
            path_qs = req.path + ("?" + urlencode(query) if query else "")
            # In a task of its own: the lean front drives its handlers without one on Python
            # 3.11, and aiohttp's client refuses to time a request outside a task ("Timeout
            # context manager should be used inside a task": every call forwarded by a
            # gateway that had lost the lease answered 500).
            call = asyncio.ensure_future(
                self.forwarder.call(owner, req.method, path_qs, req.headers, req.body)
            )
            try:
                return await call
            except asyncio.CancelledError:
                call.cancel()  # the client left: the holder sees it leave too
                raise
        except QueueError as err:
            return error_reply(err)

    def storage_failure(self) -> str | None:
        """Why a queue store refuses writes (its last write failed), or None."""
        failures = [f for b in self.backends.values() if (f := b.failure)]
        return f"queue store refuses writes: {'; '.join(failures)}" if failures else None

    def snapshot(self) -> dict[str, Any]:
        return {
            "backend": self.backend_name,
            "backends": sorted({b.name for b in self.backends.values()}),
            "serving": sorted(self.queues),
            "forwarded_total": self.forwarder.forwarded_total,
            "fsync": self.backend.fsync,
            "queues": {name: q.snapshot() for name, q in self.queues.items()},
            "dispatchers": {name: d.snapshot() for name, d in self.dispatchers.items()},
        }

    # ------------------------------------------------------------------ helpers for http/ws
    def _notify_visible(self, name: str) -> None:
        fut = self._visible.pop(name, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait_visible(self, name: str, timeout: float) -> None:
        if self.closing:
            return
        fut = self._visible.get(name)
        if fut is None or fut.done():
            fut = asyncio.get_running_loop().create_future()
            self._visible[name] = fut
        with contextlib.suppress(TimeoutError):
            # shield: a timed-out waiter must not cancel the future other waiters share
            await asyncio.wait_for(asyncio.shield(fut), timeout)

    def schedule_release(self, q: Queue, c: Consumer) -> None:
        if q.grace_s <= 0 or c.connected:
            return
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.discard(handle)
            q.release(c)

        handle = loop.call_later(q.grace_s, fire)
        self._timers.add(handle)
