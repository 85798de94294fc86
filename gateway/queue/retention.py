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

``Retention`` (one per queue, kept by the store) holds the rules: it looks at the records and
the groups and returns a decision (``Eviction``, the groups to expire), which the store
applies and journals; it never changes the queue itself. Each automatic removal is logged
once (a group's deletion; the first record evicted from a queue and then a count at most
once a minute). The admin API's and the sweeper's entry points are in gateway.queue.groups_admin.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.config import QueueConfig
from gateway.queue.records import Group, Record

if TYPE_CHECKING:
    from gateway.queue.groups import ConsumerGroups

log = logging.getLogger("gateway.queue")

EVICT_SCAN = 1024
EVICT_LOG_EVERY_S = 60.0


def connected(g: Group) -> int:
    return sum(1 for c in g.consumers.values() if c.connected)


def group_idle(g: Group, now: float) -> float:
    """Seconds since the group last had a connected consumer (0 while it has one)."""
    if connected(g):
        return 0.0
    return max(0.0, now - g.last_seen)


@dataclass(frozen=True, slots=True)
class Eviction:
    """The record a full queue may evict, and the idle groups that alone still needed it."""

    idx: int
    groups: tuple[str, ...]
    now: float


class Retention:
    """The retention rules of one queue: decisions, and the log of what was applied."""

    def __init__(self, name: str, cfg: QueueConfig) -> None:
        self.name = name
        self.cfg = cfg
        self._evict_logged_at = 0.0
        self._evict_unlogged = 0

    def eviction(self, records: Mapping[int, Record], groups: ConsumerGroups) -> Eviction | None:
        """The queue is full: its oldest record that only long-idle groups need (see the
        module's docstring), or None when the rules allow none."""
        limit = self.cfg.group_evict_idle_s
        by_gid = groups.groups
        if limit <= 0 or not by_gid:
            return None
        now = time.monotonic()
        idle = {gid for gid, g in by_gid.items() if not connected(g) and now - g.last_seen >= limit}
        if not idle:
            return None
        for scanned, rec in enumerate(records.values()):
            if scanned >= EVICT_SCAN:
                break
            needed = groups.needed_by(rec)
            if needed and idle.issuperset(needed):
                return Eviction(rec.idx, tuple(needed), now)
        return None

    def evicted(self, ev: Eviction) -> None:
        """The store applied ``ev``: logged once, then counted at most once a minute."""
        self._evict_unlogged += 1
        if ev.now - self._evict_logged_at < EVICT_LOG_EVERY_S:
            return
        log.warning(
            "queue %s is full: evicted %d record(s) (the latest %d) needed only by group(s) %s, "
            "idle for over %g s (group_evict_idle_s)",
            self.name, self._evict_unlogged, ev.idx, ", ".join(sorted(ev.groups)),
            self.cfg.group_evict_idle_s,
        )  # fmt: skip
        self._evict_logged_at = ev.now
        self._evict_unlogged = 0

    def expired(self, groups: Mapping[str, Group], ttl_s: float, now: float) -> list[tuple[str, float]]:
        """The groups idle for longer than ``ttl_s`` -> [(gid, seconds idle)]."""
        out = []
        for gid, g in groups.items():
            idle = group_idle(g, now)
            if idle > ttl_s:
                out.append((gid, idle))
        return out

    def expired_deleted(self, gid: str, idle: float, ttl_s: float, n: int) -> None:
        log.warning(
            "queue %s: group %s deleted after %.0f s without a consumer (group_idle_ttl_s %g); "
            "%d record(s) only it needed were deleted",
            self.name, gid, idle, ttl_s, n,
        )  # fmt: skip


__all__ = ["EVICT_SCAN", "Eviction", "Retention", "connected", "group_idle"]
