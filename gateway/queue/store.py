"""Queue semantics as a pure in-memory state machine over a durable backend.

No I/O and no event loop here: every method runs to completion synchronously and
returns its result plus, where something must reach the disk first, a
``Durable`` handle (a ``durable.Write``, which no caller can cancel, or None when
already durable) that the HTTP layer awaits before answering. The backend journals
the changes; on start the state is rebuilt from what the backend recovers.

``Queue`` is composed of three parts, each owning its state: the record log
(recordlog.py), the consumer groups over it (groups.py) and the retention rules
(retention.py), which only return decisions. The queue applies them, journals each
change, and registers on the change's write the undo each part hands back for its own
share of it, so that a write the store refuses leaves the memory as the store holds it.

Model (per queue):

* records: index -> Record, indexes allocated from ``next_idx`` (starts at 1, never
  reused). A put becomes *visible* (gettable, deliverable) only once durable, and
  puts become visible in index order.
* groups (the gid header): a ``cursor`` (next never-delivered index), a heap of
  ``returned`` indexes (delivered to a consumer that left), ``pending``
  (index -> uid) and ``committed`` (live indexes this group already committed,
  only non-empty while another group still needs the record). Groups are created
  by a watch only (never by a commit or a get).
* consumers (uid within a group): a window, auto_commit, a tag filter and the
  indexes outstanding at it. A record is outstanding at one consumer per group.
  The connected consumers of a group share one tag filter (the group's); a watch
  with other tags while none is connected changes the group's filter, and the
  group then scans its records again from its start, so a record an old filter
  skipped is delivered once a filter matches it.
* A commit acknowledges for the caller's group; the record is deleted once every
  group it is relevant to (start <= index, tag filter matches) has committed it.
  A commit from a gid that has no group acknowledges outside any group: it deletes
  a record that no group still needs and is refused (404) for one a group needs.
* removed records (committed, deleted, truncated, read by a get with auto_delete)
  are remembered, the last ``RECENT_LIMIT`` of them, by index and request id: a
  commit of such an index is OK (idempotent) and a put with such a request id
  returns the old index and stores nothing. The backend keeps this memory across
  restarts (sqlite.py: the tombstones of one removal in one row, written in the same
  transaction as the removal).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gateway.config import QueueConfig
from gateway.queue.backend import Backend, MemoryBackend
from gateway.queue.durable import Durable, every_durable, last_durable, on_failure
from gateway.queue.groups import ConsumerGroups
from gateway.queue.recordlog import RecordLog
from gateway.queue.records import MAX_GET_LENGTH, RECENT_LIMIT, Consumer, Group, QueueError, Record
from gateway.queue.retention import Retention, connected

__all__ = [
    "MAX_EVICTIONS_PER_PUT",
    "MAX_GET_LENGTH",
    "RECENT_LIMIT",
    "Backend",
    "Consumer",
    "Durable",
    "MemoryBackend",
    "Queue",
    "QueueError",
    "Record",
]

# A put on a queue at max_bytes may evict up to this many records pinned only by idle groups.
MAX_EVICTIONS_PER_PUT = 1024


class Queue:
    """One queue's state; all methods are synchronous and never block."""

    def __init__(self, name: str, cfg: QueueConfig, backend: Backend, grace_s: float | None = None) -> None:
        self.name = name
        self.cfg = cfg
        self.backend = backend
        # A backend that reads one record back (SQLite) lets payloads leave memory.
        reads = backend.reads_back
        self.log = RecordLog(
            name, cfg, backend.read if reads else None, backend.free_bytes if reads else None
        )
        self.consumer_groups = ConsumerGroups(self.log, cfg.grace_s if grace_s is None else grace_s)
        self.retention = Retention(name, cfg)
        self.commits_total = 0
        # Called whenever records become visible (long-poll gets wait on it).
        self.on_visible: Callable[[], None] | None = None
        self.log.on_visible = self._visible

    def load(self, state: Mapping[str, Any]) -> None:
        """Rebuild the queue from what the backend recovered (``Backend.recover``)."""
        self.log.load(state)
        self.consumer_groups.load(state.get("groups", ()), state.get("acks", ()))

    def _visible(self) -> None:
        self.consumer_groups.wake_all()
        if self.on_visible is not None:
            self.on_visible()

    # ------------------------------------------------------------------ what the parts hold
    @property
    def records(self) -> dict[int, Record]:
        return self.log.records

    @property
    def groups(self) -> dict[str, Group]:
        return self.consumer_groups.groups

    @property
    def grace_s(self) -> float:
        return self.consumer_groups.grace_s

    @property
    def length(self) -> int:
        return len(self.log.records)

    @property
    def next_idx(self) -> int:
        return self.log.next_idx

    @property
    def by_rid(self) -> dict[str, int]:
        return self.log.by_rid

    @property
    def recent(self) -> OrderedDict[int, str]:
        return self.log.recent

    @property
    def recent_rids(self) -> dict[str, int]:
        return self.log.recent_rids

    @property
    def inflight(self) -> int:
        return self.log.inflight

    @property
    def inflight_rids(self) -> dict[str, tuple[int, Durable]]:
        return self.log.inflight_rids

    @property
    def bytes(self) -> int:
        return self.log.bytes

    @property
    def cached_bytes(self) -> int:
        return self.log.cached_bytes

    @property
    def max_bytes(self) -> int:
        return self.log.max_bytes

    @property
    def puts_total(self) -> int:
        return self.log.puts_total

    @property
    def redeliveries_total(self) -> int:
        return self.consumer_groups.redeliveries_total

    def first_entry(self) -> int:
        return self.log.first_entry()

    def last_entry(self) -> int:
        return self.log.last_entry()

    def payload(self, rec: Record) -> bytes | None:
        """The record's payload, from memory or read back from the store (None once gone)."""
        return self.log.payload(rec)

    def lag(self, gid: str) -> int:
        """Live records group ``gid`` still needs."""
        return self.consumer_groups.lag(self.consumer_groups.groups[gid])

    # ------------------------------------------------------------------ put
    def put(self, data: bytes, tags: dict[str, str], rid: str | None) -> tuple[int, str, Durable]:
        """Allocate an index; the record becomes visible when the returned handle completes.
        A request id in the queue, being put or removed recently stores nothing: its index
        and (while it is being put) the first put's write, which this caller cannot cancel."""
        log = self.log
        if rid:
            known = log.known(rid)
            if known is not None:
                return known[0], rid, known[1]
        rec = self._allocate(data, tags, rid)
        dur = self.backend.put(self.name, [rec], log.next_idx)
        log.journalled([rec], dur)
        return rec.idx, rec.rid, dur

    def put_many(
        self, items: Sequence[tuple[bytes, Mapping[str, str], str | None]]
    ) -> tuple[list[tuple[int, str] | QueueError], Durable]:
        """Many puts in one journal write: per item (data, tags, request id) what ``put``
        answers, its (index, request id), or the refusal ``put`` raises (full, too large),
        and one handle for them all. A request id already in the queue, being put or
        remembered as removed stores nothing, as with ``put``; the new records become
        visible together, in index order, when the write completes."""
        log = self.log
        out: list[tuple[int, str] | QueueError] = []
        fresh: list[Record] = []
        waits: list[Durable] = []
        mine: dict[str, int] = {}  # request ids new in this call (a repeat within it stores nothing)
        for data, tags, rid in items:
            if rid:
                known = log.known(rid)
                if known is not None or rid in mine:
                    idx, dur = known if known is not None else (mine[rid], None)
                    out.append((idx, rid))
                    waits.append(dur)
                    continue
            try:
                rec = self._allocate(data, tags, rid)
            except QueueError as exc:
                out.append(exc)
                continue
            mine[rec.rid] = rec.idx
            fresh.append(rec)
            out.append((rec.idx, rec.rid))
        if fresh:
            dur = self.backend.put(self.name, fresh, log.next_idx)
            log.journalled(fresh, dur)
            waits.append(dur)
        return out, every_durable(waits)

    def _allocate(self, data: bytes, tags: Mapping[str, str], rid: str | None) -> Record:
        """A new record with the next index, counted as in flight; raises what a put refuses
        (making room first where the retention rules allow)."""
        log = self.log
        size = len(data)
        log.check_size(size)
        if log.full() and not self.make_room():
            raise QueueError(429, f"queue {self.name} is full (max_length {self.cfg.max_length})")
        evictions = 0  # by the same rule as a full max_length, within a bound per put
        while log.over_bytes(size):
            if evictions < MAX_EVICTIONS_PER_PUT and self.make_room():
                evictions += 1
                continue
            raise QueueError(
                429,
                f"queue {self.name} is full: it holds {log.bytes} payload bytes and this record of "
                f"{size} would pass max_bytes {log.max_bytes}",
            )
        return log.allocate(data, tags, rid)

    def make_room(self) -> bool:
        """The queue is full: apply the retention rules' eviction, if they allow one."""
        ev = self.retention.eviction(self.log.records, self.consumer_groups)
        if ev is None:
            return False
        self._drop([ev.idx])  # journalled before the put that follows: one handle covers both
        self.retention.evicted(ev)
        return True

    # ------------------------------------------------------------------ get
    def get(
        self, index: int, length: int, auto_delete: bool, rid: str | None, tags: Mapping[str, str]
    ) -> tuple[list[Record], Durable]:
        """Up to ``length`` records from ``index`` on, and no more than max_get_bytes of
        payload (always at least one record), each with its payload in hand: with
        ``auto_delete`` they leave the disk as soon as the returned handle completes."""
        log = self.log
        found = log.select(index, length, rid, tags)
        out = [loaded for rec in found if (loaded := log.loaded(rec)) is not None]
        if auto_delete and out:
            return out, self.delete([r.idx for r in out])
        # Read: a commit of them is legitimate now. Marked on the records the log keeps (a
        # payload read back from disk comes in a copy, marked too).
        for r in found:
            r.fetched = True
        for r in out:
            r.fetched = True
        return out, None

    # ------------------------------------------------------------------ delete / truncate
    def delete(self, idxs: Iterable[int]) -> Durable:
        return self._drop(idxs)[1]

    def truncate(self, below: int) -> tuple[int, Durable]:
        victims = self.log.below(below)
        return len(victims), self.delete(victims)

    def _drop(self, idxs: Iterable[int]) -> tuple[int, Durable]:
        """Remove records from the log and every group, and journal it (with their
        tombstones) -> (how many, handle)."""
        log, groups = self.log, self.consumer_groups
        taken = log.take_out(idxs)
        if taken is None:
            return 0, None
        forgotten, freed = groups.forget(taken.idxs)
        # The floor: the backend may drop everything below the lowest live index at once.
        dur = self.backend.delete(self.name, taken.idxs, taken.rids, log.min_live, taken.size)
        # Refused: each part takes back its own share, the log first (the groups look at it).
        on_failure(dur, lambda: log.put_back(taken))
        on_failure(dur, lambda: groups.restore(forgotten))
        groups.offer_room(freed, dur)
        return len(taken.idxs), dur

    def _settle(self, idxs: Iterable[int]) -> Durable:
        """Delete the records among ``idxs`` that some group committed and no group needs."""
        gone = self.consumer_groups.settleable(idxs)
        return self._drop(gone)[1] if gone else None

    # ------------------------------------------------------------------ watch
    def connect(
        self, gid: str, uid: str, index: int, window: int, auto_commit: bool, tags: dict[str, str]
    ) -> tuple[Consumer, Durable]:
        """A watcher arrives. A consumer with the same uid is replaced and its records resent
        first. A new group, or a new tag filter, is journalled: if that write is refused the
        watch is undone (the consumer gone, the group as it was) before its caller resumes."""
        groups = self.consumer_groups
        groups.check_tags(gid, uid, tags)
        before = groups.groups.get(gid)
        old_tags = None if before is None else dict(before.tags)
        g, new = groups.ensure(gid, index, tags)
        durs: list[Durable] = []
        if new or g.tags != tags:
            if not new:
                groups.refilter(g, tags)
            durs.append(self.backend.add_group(self.name, gid, g.start, dict(tags)))
            if not new:  # records some group committed may be needed by none now
                durs.append(self._settle(groups.acked()))
        c = groups.attach(g, uid, window, auto_commit, tags)
        dur = last_durable(durs)
        on_failure(dur, lambda: self._unwatch(c, old_tags))
        return c, dur

    def _unwatch(self, c: Consumer, tags: dict[str, str] | None) -> None:
        """Undo a watch whose group or filter was not journalled."""
        groups = self.consumer_groups
        groups.disconnect(c)
        self.release(c)
        groups.revert(c.gid, tags)

    def disconnect(self, c: Consumer) -> None:
        """The consumer's connection is gone; with no grace its records go back to the group at once."""
        if self.consumer_groups.disconnect(c):
            self.release(c)

    def release(self, c: Consumer) -> None:
        """Give a gone consumer's outstanding records back to its group (grace expired)."""
        back = self.consumer_groups.release(c)
        if back:
            self._settle(back)  # held through a filter change, some may be needed by no group now

    def take(self, c: Consumer, limit: int | None = None) -> tuple[list[tuple[Record, int]], Durable]:
        """Assign records to a connected consumer up to its free window -> (record, delivery
        count) pairs to send in order. With auto_commit the records are committed as they
        are handed out (the handle is that commit's)."""
        items, commit = self.consumer_groups.take(c, limit)
        if not commit:
            return items, None
        return items, self._commit_group(self.consumer_groups.groups[c.gid], commit)

    # ------------------------------------------------------------------ commit
    def commit(self, gid: str, idxs: list[int]) -> Durable:
        """Acknowledge for ``gid``. Validates everything first: an error changes nothing
        (see ``ConsumerGroups.check_commit``)."""
        groups = self.consumer_groups
        live = groups.check_commit(gid, idxs)
        g = groups.groups.get(gid)
        if g is None:
            n, dur = self._drop(live)  # nobody needs them: the commit deletes
            self.commits_total += n
            return dur
        return self._commit_group(g, live)

    def _commit_group(self, g: Group, idxs: Iterable[int]) -> Durable:
        groups = self.consumer_groups
        plan = groups.commit_in(g, idxs)
        self.commits_total += len(plan.delete) + len(plan.ack)
        if not plan.ack:
            return self._drop(plan.delete)[1] if plan.delete else None
        durs: list[Durable] = []
        if plan.delete:
            durs.append(self._drop(plan.delete)[1])
        acked = self.backend.ack(self.name, g.gid, plan.ack)
        groups.offer_room(plan.freed, acked)
        durs.append(acked)
        dur = last_durable(durs)
        undo = plan.undo
        if undo is not None:  # refused: uncommitted, held as before
            on_failure(dur, lambda: groups.uncommit(undo))
        return dur

    # ------------------------------------------------------------------ groups
    def delete_group(self, gid: str) -> tuple[int, Durable]:
        """Forget a group; delete the records it alone still needed -> (records deleted, handle).
        A group with a connected consumer is refused (409)."""
        groups = self.consumer_groups
        g = groups.groups.get(gid)
        if g is None:
            raise QueueError(404, f"queue {self.name} has no group {gid!r}", "group")
        if n := connected(g):
            raise QueueError(
                409, f"group {gid!r} of queue {self.name} has {n} connected consumer(s)", "group"
            )
        groups.remove(gid)  # a consumer within its grace period finds no group when it ends: a no-op
        victims = groups.owned_only_by(g)
        dropped = self.backend.drop_group(self.name, gid)
        on_failure(dropped, lambda: groups.put_back(g))  # refused: the group is back
        n, dur = self._drop(victims)
        return n, last_durable([dropped, dur])

    def expire_idle(self, ttl_s: float, now: float | None = None) -> list[tuple[str, int, Durable]]:
        """Delete the groups the retention rules find idle for longer than ``ttl_s`` ->
        [(gid, records deleted, handle)]."""
        now = time.monotonic() if now is None else now
        out = []
        for gid, idle in self.retention.expired(self.groups, ttl_s, now):
            n, dur = self.delete_group(gid)
            self.retention.expired_deleted(gid, idle, ttl_s, n)
            out.append((gid, n, dur))
        return out

    # ------------------------------------------------------------------ reports
    def search(self, gid: str, idx: int) -> dict[str, Any] | None:
        records = self.log.records
        rec = records.get(idx)
        if rec is None:
            return None
        g = self.groups.get(gid)
        if g is None:
            ahead = sum(1 for i in records if i < idx)
            return {"ConsumerId": "", "IsPending": False, "WaitCount": ahead}
        uid = g.pending.get(idx)
        if uid is not None:
            return {"ConsumerId": f"{gid}.{uid}", "IsPending": True, "WaitCount": 0}
        returned = set(g.returned)
        ahead = sum(
            1
            for i, r in records.items()
            if i < idx
            and i not in g.pending
            and i not in g.committed
            and g.relevant(r)
            and (i >= g.cursor or i in returned)
        )
        return {"ConsumerId": "", "IsPending": False, "WaitCount": ahead}

    def attributes(self, header_names: Mapping[str, str], backend_name: str) -> dict[str, str]:
        now = time.monotonic()
        a: dict[str, str] = {
            "meta.name": self.name,
            "meta.backend": backend_name,
            "meta.state": "Normal",
            "meta.maxPayloadBytes": str(self.cfg.max_payload_bytes),
            "meta.maxWindow": str(self.cfg.max_window),
            "meta.header.user": header_names["user"],
            "meta.header.group": header_names["group"],
            "meta.header.priority": header_names["priority"],
            "stream.length": str(self.length),
            "stream.approxMaxLength": str(self.cfg.max_length),
            "stream.maxLength": str(self.cfg.max_length),
            "stream.lastEntry": str(self.last_entry()),
            "stream.firstEntry": str(self.first_entry()),
            "stream.nextIndex": str(self.next_idx),
        }
        consumers: list[Consumer] = [c for g in self.groups.values() for c in g.consumers.values()]
        a["consumers.stats.total"] = str(len(consumers))
        a["consumers.status.total"] = str(len(consumers))
        a["consumers.stats.connected"] = str(sum(1 for c in consumers if c.connected))
        for i, c in enumerate(consumers):
            status = "Running" if c.connected else "Leaving"
            slots = max(0, c.room) if not c.auto_commit else c.window
            a[f"consumers.list.[{i}]"] = (
                f"Id: {c.gid}.{c.uid}, Index: {min(c.pending, default=0)}, Pending: {len(c.pending)}, "
                f"Status: {status}, Idle: {now - c.last_seen:.3f}s, Window: {c.window}, Slots: {slots}, "
                f"AutoCommit: {str(c.auto_commit).lower()}" + (f", Tags: tags{c.tags}" if c.tags else "")
            )
        a["groups.stats.total"] = str(len(self.groups))
        for i, g in enumerate(self.groups.values()):
            a[f"groups.list.[{i}]"] = (
                f"Id: {g.gid}, Index: {g.cursor}, Pending: {len(g.pending)}, "
                f"Returned: {len(g.returned)}, Consumers: {len(g.consumers)}"
            )
        return a

    def snapshot(self) -> dict[str, Any]:
        consumers = [c for g in self.groups.values() for c in g.consumers.values()]
        return {
            "length": self.length,
            "consumers": sum(1 for c in consumers if c.connected),
            "pending": sum(len(g.pending) for g in self.groups.values()),
            "groups": len(self.groups),
            "first_entry": self.first_entry(),
            "last_entry": self.last_entry(),
            "max_length": self.cfg.max_length,
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "memory_bytes": self.cached_bytes,
            "puts_total": self.puts_total,
            "commits_total": self.commits_total,
            "redeliveries_total": self.redeliveries_total,
        }
