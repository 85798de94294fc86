"""The durable storage a queue journals to: the interface and a backend that keeps nothing."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from gateway.queue.durable import Written
from gateway.queue.records import Record


class StorageError(Exception):
    """The store refused a write (disk full, read-only, I/O error, Redis unreachable)."""


class Backend(Protocol):
    """What the store and the queue manager need from durable storage (see sqlite.py,
    redis_backend.py and MemoryBackend). Every backend implements every member."""

    # What the service listing and the metrics call it ("sqlite", "redis", "memory").
    name: str
    # The durability in force ("normal", "always"; "n/a" for a backend that keeps nothing).
    fsync: str
    # Why the last write failed, until one succeeds again (None: writes succeed).
    failure: str | None
    # Whether several gateways share it (Redis): its queues are served by the holder of its
    # owner lease, which recovers them asynchronously (``recover_async``).
    shared: bool
    # Whether a record's payload can be read back (``read``): the store then keeps payloads
    # beyond its memory budget on disk only.
    reads_back: bool

    def read(self, queue: str, idx: int) -> bytes | None:
        """A stored record's payload (None: not stored); only called when ``reads_back``."""
        ...

    def free_bytes(self) -> int | None:
        """Space left for payloads (None: not known)."""
        ...

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called once the queues are loaded, on the loop that will write through it."""
        ...

    async def aclose(self, next_idx: dict[str, int] | None = None) -> None:
        """Write what is pending and close, off the event loop where closing blocks."""
        ...

    def recover(self) -> dict[str, dict[str, Any]]:
        """Per queue: next_idx, records [(idx, rid, tags, data)], groups [(gid, start, tags)],
        acks [(gid, idx)], removed [(idx, rid)] (the most recently removed records, by index)."""
        ...

    def put(self, queue: str, records: list[Record], next_idx: int) -> Written: ...
    def delete(
        self, queue: str, idxs: list[int], rids: list[str] | None = None, floor: int = 0, size: int = -1
    ) -> Written:
        """Remove records; the backend remembers their (index, request id) durably. No record
        below ``floor`` is kept any more (removed now or before): a backend may drop all of
        them in one step. ``size``: the removed records' payload bytes (-1: not known)."""
        ...

    def ack(self, queue: str, gid: str, idxs: list[int]) -> Written: ...
    def add_group(self, queue: str, gid: str, start: int, tags: dict[str, str]) -> Written:
        """Register a group, or record its new tag filter (its start never changes)."""
        ...

    def drop_group(self, queue: str, gid: str) -> Written:
        """Forget a group: its registration and what it committed."""
        ...

    def close(self, next_idx: dict[str, int] | None = None) -> None: ...


class MemoryBackend:
    """Keeps nothing: for property tests and as the reference of the interface."""

    name = "memory"
    fsync = "n/a"
    failure: str | None = None
    shared = False
    reads_back = False

    def read(self, queue: str, idx: int) -> bytes | None:
        return None

    def free_bytes(self) -> int | None:
        return None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        return None

    async def aclose(self, next_idx: dict[str, int] | None = None) -> None:
        self.close(next_idx)

    def recover(self) -> dict[str, dict[str, Any]]:
        return {}

    def put(self, queue: str, records: list[Record], next_idx: int) -> Written:
        return None

    def delete(
        self, queue: str, idxs: list[int], rids: list[str] | None = None, floor: int = 0, size: int = -1
    ) -> Written:
        return None

    def ack(self, queue: str, gid: str, idxs: list[int]) -> Written:
        return None

    def add_group(self, queue: str, gid: str, start: int, tags: dict[str, str]) -> Written:
        return None

    def drop_group(self, queue: str, gid: str) -> Written:
        return None

    def close(self, next_idx: dict[str, int] | None = None) -> None:
        return None
