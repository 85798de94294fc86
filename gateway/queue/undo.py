"""Undoing in memory what the store refused to write.

The queue changes its memory at once and journals the change (``Durable``); the client is
answered when the write is durable, or 507 when the store refused it (disk full, read-only,
Redis refusing writes). A refused removal must then not stay applied in memory: the
records would be gone until the next restart and back after it. So a removal remembers
what it changes (the records, and per group whether it had committed each and which
consumer held it) and puts it back when its write fails, before the waiting client is
answered (the undo is the write's first done-callback). A record put back that its group
had handed out and whose consumer is gone meanwhile is handed back to the group, so no
record is stranded.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from gateway.queue.backend import StorageError
from gateway.queue.durable import on_failure
from gateway.queue.records import Consumer, Durable, Group, QueueError

if TYPE_CHECKING:
    from gateway.queue.groups import ConsumerGroups


class Removal:
    """What removing some records changes, captured before the removal."""

    def __init__(self, q: ConsumerGroups, idxs: Iterable[int]) -> None:
        # On the commit path, so in bulk: set and dict-key intersections run in C.
        get = q.records.get
        self.records = [rec for idx in idxs if (rec := get(idx)) is not None]
        live = {rec.idx for rec in self.records}
        self.groups: list[tuple[Group, set[int], dict[int, str], dict[int, int]]] = []
        for g in q.groups.values():
            touched = live & g.deliveries.keys()  # every record handed out (pending ones too)
            committed = live & g.committed
            if touched or committed:
                pending = {i: g.pending[i] for i in touched & g.pending.keys()}
                self.groups.append((g, committed, pending, {i: g.deliveries[i] for i in touched}))

    def restore(self, q: ConsumerGroups) -> None:
        back: dict[int, None] = {}  # in index order, and quick to look up
        for rec in self.records:
            idx = rec.idx
            if idx in q.records:
                continue
            q.records[idx] = rec
            q.by_rid[rec.rid] = idx
            q.bytes += rec.size
            if rec.data is not None:
                q.cached_bytes += rec.size
            if q.recent.get(idx) == rec.rid:
                del q.recent[idx]
                if q.recent_rids.get(rec.rid) == idx:
                    del q.recent_rids[rec.rid]
            q.min_live = min(q.min_live, idx)
            back[idx] = None
        if back and max(q.records) > min(back):
            # Back in index order: gets and truncation walk the records in insertion order.
            ordered = sorted(q.records.items())
            q.records.clear()
            q.records.update(ordered)
        held: dict[int, dict[int, str]] = {}
        for g, committed, pending, deliveries in self.groups:
            g.committed.update(i for i in committed if i in back)
            g.deliveries.update(deliveries)
            held[id(g)] = pending
        for g in q.groups.values():
            pending = held.get(id(g), {})
            give_back(q, g, ((idx, pending.get(idx)) for idx in back))
        q._wake_all()


def give_back(q: ConsumerGroups, g: Group, held: Iterable[tuple[int, str | None]]) -> None:
    """Records back in the queue, each with the uid that held it (None: none did), back in
    ``g``: all but those it still has, held, committed or waiting among its returned records
    (a removal leaves its indexes there; a hand-out skips the ones that are gone)."""
    queued = set(g.returned)
    for idx, uid in held:
        if idx in q.records and idx not in g.committed and idx not in g.pending and idx not in queued:
            reassign(q, g, idx, uid)


def reassign(q: ConsumerGroups, g: Group, idx: int, uid: str | None) -> None:
    """Give a record back to the consumer that held it if it is still there, else to the group.
    (An auto-commit consumer holds records too: those it held on a plain connection before.)"""
    c = g.consumers.get(uid) if uid is not None else None
    if c is not None and c.connected:
        g.pending[idx] = c.uid
        c.pending[idx] = None
    else:
        q._hand_back(g, idx)


class Assignments:
    """The records a commit took off a group's consumers, with the uid that held each
    (None: none did), to put back if the commit's write fails."""

    def __init__(self, g: Group, held: list[tuple[int, str | None]]) -> None:
        self.g = g
        self.held = held

    def restore(self, q: ConsumerGroups) -> None:
        g = self.g
        if q.groups.get(g.gid) is not g:
            return  # deleted meanwhile
        g.committed.difference_update(idx for idx, _ in self.held)
        give_back(q, g, self.held)
        q._wake_group(g)


class Watch:
    """A watch's group as it was before the watch (absent, or its tag filter), to put back
    if registering the group or its new filter is refused: the watch is then answered 507
    and the group is as it was (a new one gone, if no other consumer joined it meanwhile)."""

    def __init__(self, q: ConsumerGroups, gid: str) -> None:
        g = q.groups.get(gid)
        self.gid = gid
        self.tags = None if g is None else dict(g.tags)

    async def durable(self, q: ConsumerGroups, c: Consumer, dur: Durable) -> QueueError | None:
        """Await the watch's write; on a refusal undo the watch -> the error to answer."""
        if dur is None:
            return None
        try:
            await dur
        except StorageError as exc:
            q.disconnect(c)
            q.release(c)
            g = q.groups.get(self.gid)
            if g is not None and not g.consumers:
                if self.tags is None:
                    del q.groups[self.gid]
                else:
                    g.tags = self.tags  # the rescan the change started does no harm
            return QueueError(507, f"queue storage unavailable: {exc}")
        return None


__all__ = ["Assignments", "Removal", "Watch", "give_back", "on_failure", "reassign"]
