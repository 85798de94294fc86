"""QueueManager: every queue of the gateway over one durable store (docs/architecture.md).

Queue names: a service with ``processor: queue`` is the queue "<name>"; an
asynchronous service (``async: true``) has "<name>" (input) and "<name>/sink".
The embedded store lives in ``<data_dir>/queues.sqlite3``; a queue whose config names a
Redis URL (``queue.backend``) lives in that Redis (one ``RedisBackend`` per URL).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from eas_sdk._core import constants as C
from gateway.config import Config, QueueConfig, ServiceConfig

from .backend import Backend, MemoryBackend
from .http import handle_http
from .records import Consumer
from .redis_backend import RedisBackend
from .sqlite import SqliteBackend
from .store import Queue
from .ws import handle_watch

DB_FILE = "queues.sqlite3"


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
                self.backends[kind] = RedisBackend(kind, fsync=fsync)
            else:
                path = ":memory:" if data_dir is None else os.path.join(data_dir, DB_FILE)
                self.backends[kind] = SqliteBackend(path, fsync=fsync)
        self.queue_backends: dict[str, Backend] = {n: self.backends[k] for n, k in kinds.items()}
        # The main store: what the service listing and the store's tests look at.
        self.backend: Backend = next(iter(self.backends.values()), backend or MemoryBackend())
        self.backend_name = getattr(self.backend, "name", type(self.backend).__name__)
        self.queues: dict[str, Queue] = {}
        self.watchers: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()
        self._visible: dict[str, asyncio.Future[None]] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        self._started = False
        self.closing = False
        # Async services' dispatchers (service name -> Dispatcher), registered by
        # gateway.queue.dispatcher.setup: their figures join the snapshot.
        self.dispatchers: dict[str, Any] = {}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._started:
            return
        loop = asyncio.get_running_loop()
        recovered: dict[str, dict[str, Any]] = {}
        for b in self.backends.values():
            mine = [n for n, qb in self.queue_backends.items() if qb is b]
            recover_async = getattr(b, "recover_async", None)
            if recover_async is not None:
                recovered.update(await recover_async(mine))
            else:
                recovered.update(await asyncio.to_thread(b.recover))
        for name, cfg in self.configs.items():
            q = Queue(name, cfg, self.queue_backends[name])
            if name in recovered:
                q.load(recovered[name])
            q.on_visible = lambda n=name: self._notify_visible(n)
            self.queues[name] = q
        for b in self.backends.values():
            start = getattr(b, "start", None)
            if start is not None:
                start(loop)
        self._started = True

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        for t in list(self._timers):
            t.cancel()
        self._timers.clear()
        await self.shutdown()
        for b in self.backends.values():
            next_idx = {name: q.next_idx for name, q in self.queues.items() if q.backend is b}
            aclose = getattr(b, "aclose", None)
            if aclose is not None:
                await aclose(next_idx)
            else:
                await asyncio.to_thread(b.close, next_idx)

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
        if q is None:
            return web.Response(status=404, text=f"queue {queue_name!r} not found")
        if request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket":
            return await handle_watch(self, q, request)
        return await handle_http(self, q, request)

    def snapshot(self) -> dict[str, Any]:
        return {
            "backend": self.backend_name,
            "backends": sorted({getattr(b, "name", type(b).__name__) for b in self.backends.values()}),
            "fsync": getattr(self.backend, "fsync", "n/a"),
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
