"""What the queue's HTTP and WebSocket handlers need from their surroundings.

The handlers are written against these protocols rather than against ``QueueManager``
(which routes requests to them), so the dependency runs one way: manager -> handlers.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableSet
from typing import Protocol

from aiohttp import web

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
