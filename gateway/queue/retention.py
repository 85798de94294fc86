"""Consumer groups listed and deleted, and the retention that keeps an abandoned group from
pinning records forever.

A record stays until every group it concerns has committed it, so a group whose consumers
never come back would keep its records (and fill the queue to ``max_length``, answering 429
from then on). Three ways out:

* **delete a group** (admin API, CLI): the group is forgotten and journalled so; the records
  it had not committed are deleted unless another group still needs them. A group with a
  connected consumer is not deleted (409): its watch would go on without a group.
* **idle time** (``group_idle_ttl_s``, default 24 h, 0: never): a group with no connected
  consumer for that long is deleted the same way, by a sweep every ``ttl / 4`` (at most a
  minute).
* **size** (``group_evict_idle_s``, default 1 h, 0: never): a put that finds the queue at
  ``max_length`` deletes the oldest live record that only groups idle (no connected
  consumer) for at least that long still need, and is then stored. Records no group needs
  (put before any watch, read by gets) are never evicted: the queue answers 429 for those,
  as back-pressure. Only the oldest ``EVICT_SCAN`` live records are looked at, so a put on a
  full queue stays cheap.

Each automatic removal is logged once (a group's deletion; the first record evicted from a
queue and then a count at most once a minute).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from gateway.queue.records import Durable, QueueError, last_durable
from gateway.queue.undo import on_failure

if TYPE_CHECKING:
    from gateway.queue.store import Queue

log = logging.getLogger("gateway.queue")

EVICT_SCAN = 1024
EVICT_LOG_EVERY_S = 60.0


def _connected(q: Queue, gid: str) -> int:
    return sum(1 for c in q.groups[gid].consumers.values() if c.connected)


def idle_for(q: Queue, gid: str, now: float) -> float:
    """Seconds since the group last had a connected consumer (0 while it has one)."""
    if _connected(q, gid):
        return 0.0
    return max(0.0, now - q.groups[gid].last_seen)


def list_groups(q: Queue) -> list[dict[str, Any]]:
    """Every group of the queue: position, what it holds and what it still needs."""
    now, wall = time.monotonic(), time.time()
    out = []
    for gid, g in q.groups.items():
        idle = idle_for(q, gid, now)
        lag = sum(1 for idx, rec in q.records.items() if idx not in g.committed and g.relevant(rec))
        out.append(
            {
                "group": gid,
                "start": g.start,
                "cursor": g.cursor,
                "tags": dict(g.tags),
                "pending": len(g.pending),
                "lag": lag,
                "consumers": _connected(q, gid),
                "idle_s": round(idle, 3),
                "last_seen": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall - idle)),
            }
        )
    return out


def delete_group(q: Queue, gid: str) -> tuple[int, Durable]:
    """Forget a group; delete the records it alone still needed -> (records deleted, handle)."""
    g = q.groups.get(gid)
    if g is None:
        raise QueueError(404, f"queue {q.name} has no group {gid!r}", "group")
    if n := _connected(q, gid):
        raise QueueError(409, f"group {gid!r} of queue {q.name} has {n} connected consumer(s)", "group")
    del q.groups[gid]  # a consumer within its grace period finds no group when it ends: a no-op
    victims = [idx for idx, rec in q.records.items() if idx not in g.committed and g.relevant(rec)]
    victims = [idx for idx in victims if not q._needed_by(q.records[idx])]
    durs: list[Durable] = [q.backend.drop_group(q.name, gid)]
    on_failure(durs[0], lambda: q.groups.setdefault(gid, g))  # refused: the group is back
    n, dur = q._drop(victims)
    durs.append(dur)
    return n, last_durable(durs)


def expire_idle(q: Queue, ttl_s: float, now: float | None = None) -> list[tuple[str, int, Durable]]:
    """Delete the groups idle for longer than ``ttl_s`` -> [(gid, records deleted, handle)]."""
    now = time.monotonic() if now is None else now
    out = []
    for gid in [gid for gid in q.groups if idle_for(q, gid, now) > ttl_s]:
        idle = idle_for(q, gid, now)
        n, dur = delete_group(q, gid)
        log.warning(
            "queue %s: group %s deleted after %.0f s without a consumer (group_idle_ttl_s %g); "
            "%d record(s) only it needed were deleted",
            q.name, gid, idle, ttl_s, n,
        )  # fmt: skip
        out.append((gid, n, dur))
    return out


class _EvictLog:
    def __init__(self) -> None:
        self.logged_at = 0.0
        self.unlogged = 0


_evict_logs: weakref.WeakKeyDictionary[Any, _EvictLog] = weakref.WeakKeyDictionary()


def make_room(q: Queue) -> bool:
    """The queue is full: evict its oldest record that only long-idle groups need (see the
    module's docstring). True if one was evicted."""
    limit = q.cfg.group_evict_idle_s
    if limit <= 0 or not q.groups:
        return False
    now = time.monotonic()
    idle = {gid for gid in q.groups if not _connected(q, gid) and now - q.groups[gid].last_seen >= limit}
    if not idle:
        return False
    for scanned, (idx, rec) in enumerate(q.records.items()):
        if scanned >= EVICT_SCAN:
            break
        needed = q._needed_by(rec)
        if needed and idle.issuperset(needed):
            q._drop([idx])  # journalled before the put that follows: one handle covers both
            _log_eviction(q, idx, needed, limit, now)
            return True
    return False


def _log_eviction(q: Queue, idx: int, groups: Iterable[str], limit: float, now: float) -> None:
    state = _evict_logs.setdefault(q, _EvictLog())
    state.unlogged += 1
    if now - state.logged_at < EVICT_LOG_EVERY_S:
        return
    log.warning(
        "queue %s is full: evicted %d record(s) (the latest %d) needed only by group(s) %s, "
        "idle for over %g s (group_evict_idle_s)",
        q.name, state.unlogged, idx, ", ".join(sorted(groups)), limit,
    )  # fmt: skip
    state.logged_at = now
    state.unlogged = 0


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
                        expire_idle(q, ttl)
                    except Exception:  # one queue's failure must not end the sweeps
                        log.exception("queue %s: idle group sweep failed", q.name)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None


__all__ = ["EVICT_SCAN", "Sweeper", "delete_group", "expire_idle", "idle_for", "list_groups", "make_room"]
