"""Consumer groups listed, deleted and swept for idleness: the admin API's and the sweeper's
entry points over a queue (the rules are gateway.queue.retention's, applied by the store)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from gateway.queue.records import Durable
from gateway.queue.retention import connected, group_idle
from gateway.queue.store import Queue

log = logging.getLogger("gateway.queue")


def idle_for(q: Queue, gid: str, now: float) -> float:
    """Seconds since the group last had a connected consumer (0 while it has one)."""
    return group_idle(q.groups[gid], now)


def list_groups(q: Queue) -> list[dict[str, Any]]:
    """Every group of the queue: position, what it holds and what it still needs."""
    now, wall = time.monotonic(), time.time()
    out = []
    for gid, g in q.groups.items():
        idle = group_idle(g, now)
        out.append(
            {
                "group": gid,
                "start": g.start,
                "cursor": g.cursor,
                "tags": dict(g.tags),
                "pending": len(g.pending),
                "lag": q.lag(gid),
                "consumers": connected(g),
                "idle_s": round(idle, 3),
                "last_seen": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall - idle)),
            }
        )
    return out


def delete_group(q: Queue, gid: str) -> tuple[int, Durable]:
    """Forget a group; delete the records it alone still needed -> (records deleted, handle)."""
    return q.delete_group(gid)


def expire_idle(q: Queue, ttl_s: float, now: float | None = None) -> list[tuple[str, int, Durable]]:
    """Delete the groups idle for longer than ``ttl_s`` -> [(gid, records deleted, handle)]."""
    return q.expire_idle(ttl_s, now)


class Sweeper:
    """Deletes idle groups of every queue served here, every ``ttl / 4`` (at most a minute)."""

    def __init__(self, queues: Callable[[], Iterable[Queue]], ttls: Iterable[float]) -> None:
        """``ttls``: every configured queue's, also of queues served here only later (a Redis
        store whose lease this gateway gains)."""
        self.queues = queues
        self.ttls = [t for t in ttls if t > 0]
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        ttls = self.ttls
        if ttls and self.task is None:
            self.task = asyncio.create_task(self._run(max(0.05, min(60.0, min(ttls) / 4))))

    async def _run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            for q in list(self.queues()):
                ttl = q.cfg.group_idle_ttl_s
                if ttl > 0:
                    try:
                        q.expire_idle(ttl)
                    except Exception:  # one queue's failure must not end the sweeps
                        log.exception("queue %s: idle group sweep failed", q.name)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None


__all__ = ["Sweeper", "delete_group", "expire_idle", "idle_for", "list_groups"]
