"""The durable storage a queue journals to: the interface and a backend that keeps nothing."""

from __future__ import annotations

from typing import Any, Protocol

from gateway.queue.records import Durable, Record


class StorageError(Exception):
    """The store refused a write (disk full, read-only, I/O error, Redis unreachable)."""


class Backend(Protocol):
    """What the store needs from durable storage (see sqlite.py, redis_backend.py and
    MemoryBackend).

    A backend whose I/O is asynchronous (``RedisBackend``) also has
    ``async recover_async(queues)`` and ``async aclose(next_idx)``, which the manager
    prefers to ``recover`` and ``close``; ``start(loop)``, when present, is called once
    the queues are loaded."""

    def recover(self) -> dict[str, dict[str, Any]]:
        """Per queue: next_idx, records [(idx, rid, tags, data)], groups [(gid, start, tags)],
        acks [(gid, idx)], removed [(idx, rid)] (the most recently removed records, by index)."""
        ...

    def put(self, queue: str, records: list[Record], next_idx: int) -> Durable: ...
    def delete(
        self, queue: str, idxs: list[int], rids: list[str] | None = None, floor: int = 0, size: int = -1
    ) -> Durable:
        """Remove records; the backend remembers their (index, request id) durably. No record
        below ``floor`` is kept any more (removed now or before): a backend may drop all of
        them in one step. ``size``: the removed records' payload bytes (-1: not known)."""
        ...

    def ack(self, queue: str, gid: str, idxs: list[int]) -> Durable: ...
    def add_group(self, queue: str, gid: str, start: int, tags: dict[str, str]) -> Durable:
        """Register a group, or record its new tag filter (its start never changes)."""
        ...

    def drop_group(self, queue: str, gid: str) -> Durable:
        """Forget a group: its registration and what it committed."""
        ...

    def close(self, next_idx: dict[str, int] | None = None) -> None: ...


class MemoryBackend:
    """Keeps nothing: for property tests and as the reference of the interface."""

    def recover(self) -> dict[str, dict[str, Any]]:
        return {}

    def put(self, queue: str, records: list[Record], next_idx: int) -> Durable:
        return None

    def delete(
        self, queue: str, idxs: list[int], rids: list[str] | None = None, floor: int = 0, size: int = -1
    ) -> Durable:
        return None

    def ack(self, queue: str, gid: str, idxs: list[int]) -> Durable:
        return None

    def add_group(self, queue: str, gid: str, start: int, tags: dict[str, str]) -> Durable:
        return None

    def drop_group(self, queue: str, gid: str) -> Durable:
        return None

    def close(self, next_idx: dict[str, int] | None = None) -> None:
        return None
