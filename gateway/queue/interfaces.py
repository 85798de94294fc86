"""What the queue's HTTP and WebSocket handlers need from their surroundings.

The handlers are written against these protocols rather than against ``QueueManager``
(which routes requests to them), so the dependency runs one way: manager -> handlers.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableSet
from typing import Any, Protocol

from aiohttp import web

from gateway.config import QueueConfig
from gateway.lean_http import FastRequest, Query, Reply
from gateway.queue.dispatcher import DispatchHost
from gateway.queue.records import Consumer
from gateway.queue.store import Queue


class RequestLike(Protocol):
    """What the handlers read from a request: an aiohttp ``web.Request`` or the fast path's."""

    @property
    def method(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...  # case-insensitive
    @property
    def content_length(self) -> int | None: ...
    async def read(self) -> bytes: ...


class QueueHost(Protocol):
    """The owner of the queues (``QueueManager``) as the handlers see it."""

    @property
    def closing(self) -> bool:
        """Set once shutdown began: long polls answer at once from then on."""
        ...

    @property
    def backend_name(self) -> str: ...
    @property
    def watchers(self) -> MutableSet[web.WebSocketResponse]:
        """Open watches, closed with 1001 on shutdown."""
        ...

    async def wait_visible(self, name: str, timeout: float) -> None:
        """Return when records become visible in queue ``name``, or after ``timeout`` seconds."""
        ...

    def schedule_release(self, q: Queue, c: Consumer) -> None:
        """Give a gone consumer's records back to its group once its grace period ends."""
        ...


class QueueService(QueueHost, DispatchHost, Protocol):
    """The queue manager (``gateway.queue.QueueManager``) as the application, the fronts and
    the CLI use it. The lean front also hands it to the queue's own handlers (``QueueHost``),
    and the application to the async dispatchers (``DispatchHost``: the queues served here,
    the dispatchers' registry, the callbacks run when the queues served here change)."""

    @property
    def configs(self) -> Mapping[str, QueueConfig]:
        """Every configured queue, whether this gateway serves it now or not."""
        ...

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def shutdown(self) -> None:
        """End long polls and watches, so that the gateway's stop is not held up by them."""
        ...

    def advertise(self, host: str, port: int) -> None:
        """Where other gateways sharing a Redis store forward this one's queue calls."""
        ...

    def has(self, name: str) -> bool: ...
    async def handle(self, request: web.Request, queue_name: str) -> web.StreamResponse: ...

    async def forward(self, queue_name: str, req: FastRequest, query: Query) -> Reply:
        """A plain call from the lean front for a queue another gateway serves."""
        ...

    def storage_failure(self) -> str | None:
        """Why a queue store refuses writes (its last write failed), or None."""
        ...

    def snapshot(self) -> dict[str, Any]: ...
