"""Queue semantics as a pure in-memory state machine over a durable backend.

No I/O and no event loop here: every method runs to completion synchronously and
returns its result plus, where something must reach the disk first, a
``Durable`` handle (an awaitable, or None when already durable) that the HTTP
layer awaits before answering. The backend journals the changes; on start the
state is rebuilt from what the backend recovers.

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

import heapq
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.config import QueueConfig

Durable = Awaitable[Any] | None

# Bounded memory of removed records (index -> request id, kept durable by the backend), so
# that a repeated commit stays idempotent and a retried put (same request id) returns the
# same index after its record was consumed, across restarts too.
RECENT_LIMIT = 100_000
MAX_GET_LENGTH = 10_000
# With auto_commit the window does not limit; records are handed out in slices this big.
AUTO_COMMIT_SLICE = 256


class QueueError(Exception):
    """A request the queue refuses; ``param`` names the offending parameter."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


@dataclass(slots=True)
class Record:
    idx: int
    rid: str
    tags: dict[str, str]
    data: bytes
    fetched: bool = False  # returned by a get (a later commit is then legitimate)


@dataclass(eq=False)
class Consumer:
    gid: str
    uid: str
    window: int
    auto_commit: bool
    tags: dict[str, str]
    conn: int  # connection generation; a stale connection's disconnect is ignored
    pending: dict[int, None] = field(default_factory=dict)  # outstanding, in delivery order
    resend: list[int] = field(default_factory=list)  # taken over from a previous connection
    connected: bool = True
    since: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    delivered: int = 0
    wake: Callable[[], None] | None = None

    @property
    def room(self) -> int:
        if self.auto_commit:
            return AUTO_COMMIT_SLICE
        return self.window - len(self.pending)


@dataclass(eq=False)
class Group:
    gid: str
    start: int
    tags: dict[str, str]
    cursor: int
    returned: list[int] = field(default_factory=list)  # heap
    pending: dict[int, str] = field(default_factory=dict)  # idx -> uid
    committed: set[int] = field(default_factory=set)
    consumers: dict[str, Consumer] = field(default_factory=dict)
    deliveries: dict[int, int] = field(default_factory=dict)  # idx -> delivery count (in memory)

    def relevant(self, rec: Record) -> bool:
        return rec.idx >= self.start and _matches(self.tags, rec.tags)


def _matches(want: Mapping[str, str], have: Mapping[str, str]) -> bool:
    for k, v in want.items():
        if have.get(k) != v:
            return False
    return True


class Backend(Protocol):
    """What the store needs from durable storage (see sqlite.py and MemoryBackend)."""

    def recover(self) -> dict[str, dict[str, Any]]:
        """Per queue: next_idx, records [(idx, rid, tags, data)], groups [(gid, start, tags)],
        acks [(gid, idx)], removed [(idx, rid)] (the most recently removed records, by index)."""
        ...

    def put(self, queue: str, records: list[Record], next_idx: int) -> Durable: ...
    def delete(self, queue: str, idxs: list[int], rids: list[str] | None = None) -> Durable:
        """Remove records; the backend remembers their (index, request id) durably."""
        ...

    def ack(self, queue: str, gid: str, idxs: list[int]) -> Durable: ...
    def add_group(self, queue: str, gid: str, start: int, tags: dict[str, str]) -> Durable:
        """Register a group, or record its new tag filter (its start never changes)."""
        ...

    def close(self, next_idx: dict[str, int] | None = None) -> None: ...


class MemoryBackend:
    """Keeps nothing: for property tests and as the reference of the interface."""

    def recover(self) -> dict[str, dict[str, Any]]:
        return {}

    def put(self, queue: str, records: list[Record], next_idx: int) -> Durable:
        return None

    def delete(self, queue: str, idxs: list[int], rids: list[str] | None = None) -> Durable:
        return None

    def ack(self, queue: str, gid: str, idxs: list[int]) -> Durable:
        return None

    def add_group(self, queue: str, gid: str, start: int, tags: dict[str, str]) -> Durable:
        return None

    def close(self, next_idx: dict[str, int] | None = None) -> None:
        return None


class Queue:
    """One queue's state; all methods are synchronous and never block."""

    def __init__(self, name: str, cfg: QueueConfig, backend: Backend, grace_s: float | None = None) -> None:
        self.name = name
        self.cfg = cfg
        self.backend = backend
        self.grace_s = cfg.grace_s if grace_s is None else grace_s
        self.next_idx = 1  # next index to allocate
        self.visible_next = 1  # every index below is visible or gone
        self.min_live = 1  # no live record below (advanced lazily)
        self.records: dict[int, Record] = {}
        self.by_rid: dict[str, int] = {}
        self.inflight = 0  # puts allocated but not yet durable
        self.inflight_rids: dict[str, tuple[int, Durable]] = {}
        # Removed records (committed, deleted, truncated, consumed by get), oldest first.
        self.recent: OrderedDict[int, str] = OrderedDict()  # idx -> rid
        self.recent_rids: dict[str, int] = {}
        self.groups: dict[str, Group] = {}
        self.recovered_below = 0
        self._conn_seq = 0
        # Called whenever records become visible (long-poll gets wait on it).
        self.on_visible: Callable[[], None] | None = None
        self.puts_total = 0
        self.commits_total = 0
        self.redeliveries_total = 0

    # ------------------------------------------------------------------ recovery
    def load(self, state: Mapping[str, Any]) -> None:
        self.next_idx = max(1, int(state.get("next_idx", 1)))
        for idx, rid, tags, data in state.get("records", ()):
            rec = Record(idx, rid, tags, data)
            self.records[idx] = rec
            self.by_rid[rid] = idx
            self.next_idx = max(self.next_idx, idx + 1)
        for idx, rid in state.get("removed", ()):
            if idx not in self.records:
                self._remember(idx, rid)
                self.next_idx = max(self.next_idx, idx + 1)
        self.visible_next = self.next_idx
        self.min_live = min(self.records, default=self.next_idx)
        # Deliveries are not journalled: a record recovered here may have been delivered
        # before the restart, so any group may commit it.
        self.recovered_below = self.next_idx
        for gid, start, tags in state.get("groups", ()):
            g = Group(gid, start, dict(tags), cursor=max(start, self.min_live))
            self.groups[gid] = g
        for gid, idx in state.get("acks", ()):
            g = self.groups.get(gid)
            if g is not None and idx in self.records:
                g.committed.add(idx)

    # ------------------------------------------------------------------ helpers
    @property
    def length(self) -> int:
        return len(self.records)

    def _advance_min_live(self) -> None:
        while self.min_live < self.visible_next and self.min_live not in self.records:
            self.min_live += 1

    def first_entry(self) -> int:
        self._advance_min_live()
        return self.min_live if self.records else 0

    def last_entry(self) -> int:
        # The highest index ever allocated and made visible (0 before the first put).
        return self.visible_next - 1

    def _remember(self, idx: int, rid: str) -> None:
        self.recent[idx] = rid
        self.recent_rids[rid] = idx
        if len(self.recent) > RECENT_LIMIT:
            old_idx, old_rid = self.recent.popitem(last=False)
            if self.recent_rids.get(old_rid) == old_idx:
                del self.recent_rids[old_rid]

    def _drop(self, idxs: Iterable[int]) -> tuple[int, Durable]:
        """Remove records and journal it (with their tombstones); -> (how many, handle)."""
        rids: list[str] = []
        removed = self._remove(idxs, rids)
        return len(removed), (self.backend.delete(self.name, removed, rids) if removed else None)

    def _remove(self, idxs: Iterable[int], rids: list[str] | None = None) -> list[int]:
        removed: list[int] = []
        for idx in idxs:
            rec = self.records.pop(idx, None)
            if rec is None:
                continue
            removed.append(idx)
            if rids is not None:
                rids.append(rec.rid)
            self.by_rid.pop(rec.rid, None)
            self._remember(idx, rec.rid)
            for g in self.groups.values():
                g.committed.discard(idx)
                g.deliveries.pop(idx, None)
                uid = g.pending.pop(idx, None)
                if uid is not None:
                    c = g.consumers.get(uid)
                    if c is not None:
                        c.pending.pop(idx, None)
                        self._wake(c)
        return removed

    def _wake(self, c: Consumer) -> None:
        if c.connected and c.wake is not None and c.room > 0:
            c.wake()

    def _wake_group(self, g: Group) -> None:
        for c in g.consumers.values():
            self._wake(c)

    def _wake_all(self) -> None:
        for g in self.groups.values():
            self._wake_group(g)

    # ------------------------------------------------------------------ put
    def put(self, data: bytes, tags: dict[str, str], rid: str | None) -> tuple[int, str, Durable]:
        """Allocate an index; the record becomes visible when the returned handle completes."""
        if rid:
            if rid in self.by_rid:
                return self.by_rid[rid], rid, None
            if rid in self.inflight_rids:
                idx, dur = self.inflight_rids[rid]
                return idx, rid, dur
            if rid in self.recent_rids:
                return self.recent_rids[rid], rid, None
        else:
            rid = str(uuid.uuid4())
        if len(data) > self.cfg.max_payload_bytes:
            raise QueueError(
                413, f"record of {len(data)} bytes exceeds maxPayloadBytes {self.cfg.max_payload_bytes}"
            )
        if len(self.records) + self.inflight >= self.cfg.max_length:
            raise QueueError(429, f"queue {self.name} is full (max_length {self.cfg.max_length})")
        idx = self.next_idx
        self.next_idx += 1
        tags = dict(tags)
        tags["requestId"] = rid
        rec = Record(idx, rid, tags, data)
        self.inflight += 1
        dur = self.backend.put(self.name, [rec], self.next_idx)
        if dur is None:
            self.inflight -= 1
            self._make_visible(rec)
            return idx, rid, None
        self.inflight_rids[rid] = (idx, dur)
        add_done = getattr(dur, "add_done_callback", None)
        if add_done is not None:
            add_done(lambda f: self.put_done(idx, rid, rec, not f.cancelled() and f.exception() is None))
        return idx, rid, dur

    def put_done(self, rec_idx: int, rid: str, rec: Record | None, ok: bool) -> None:
        """Called by the durability layer when a put's batch committed (or failed)."""
        self.inflight -= 1
        self.inflight_rids.pop(rid, None)
        if ok and rec is not None:
            self._make_visible(rec)
        else:
            self.visible_next = max(self.visible_next, rec_idx + 1)

    def _make_visible(self, rec: Record) -> None:
        self.records[rec.idx] = rec
        self.by_rid[rec.rid] = rec.idx
        self.visible_next = max(self.visible_next, rec.idx + 1)
        self.puts_total += 1
        self._wake_all()
        if self.on_visible is not None:
            self.on_visible()

    # ------------------------------------------------------------------ get
    def get(
        self, index: int, length: int, auto_delete: bool, rid: str | None, tags: Mapping[str, str]
    ) -> tuple[list[Record], Durable]:
        out: list[Record] = []
        if rid is not None:
            idx = self.by_rid.get(rid)
            if idx is not None and idx in self.records:
                out.append(self.records[idx])
        else:
            start = max(index, 1)
            self._advance_min_live()
            start = max(start, self.min_live)
            if self.visible_next - start <= 2 * len(self.records):
                it: Iterable[int] = range(start, self.visible_next)
            else:
                it = (i for i in self.records if i >= start)
            for i in it:
                rec = self.records.get(i)
                if rec is not None and _matches(tags, rec.tags):
                    out.append(rec)
                    if len(out) >= length:
                        break
        dur: Durable = None
        if auto_delete and out:
            dur = self.delete([r.idx for r in out])
        else:
            for r in out:
                r.fetched = True
        return out, dur

    # ------------------------------------------------------------------ delete / truncate
    def delete(self, idxs: list[int]) -> Durable:
        return self._drop(idxs)[1]

    def truncate(self, below: int) -> tuple[int, Durable]:
        self._advance_min_live()
        if self.visible_next - self.min_live <= 2 * len(self.records):
            victims = [i for i in range(self.min_live, min(below, self.visible_next)) if i in self.records]
        else:
            victims = [i for i in self.records if i < below]
        return len(victims), self.delete(victims)

    # ------------------------------------------------------------------ groups / consumers
    def _group(self, gid: str, start: int, tags: dict[str, str]) -> tuple[Group, Durable]:
        g = self.groups.get(gid)
        if g is not None:
            return g, None
        self._advance_min_live()
        start = max(start, 1)
        g = Group(gid, start, dict(tags), cursor=max(start, self.min_live))
        self.groups[gid] = g
        return g, self.backend.add_group(self.name, gid, start, dict(tags))

    def _refilter(self, g: Group, tags: dict[str, str]) -> Durable:
        """The group's tag filter changes (no consumer of it is connected).

        The group scans its records again from its start: records the old filter skipped
        (or handed back) are delivered once they match, and committed or still pending
        ones are skipped as usual. Records the group no longer needs and every other
        group has committed are deleted."""
        g.tags = dict(tags)
        self._advance_min_live()
        g.cursor = max(g.start, self.min_live)
        g.returned = []  # the rescan covers them
        durs = [self.backend.add_group(self.name, g.gid, g.start, dict(tags)), self._settle(self._acked())]
        return _last(durs)

    def _acked(self) -> list[int]:
        """Live records some group committed (and some other group has not)."""
        out: set[int] = set()
        for g in self.groups.values():
            out.update(g.committed)
        return sorted(out)

    def _needed_by(self, rec: Record, but: Group | None = None) -> list[str]:
        """The groups (other than ``but``) that still owe this record a commit."""
        return [
            other.gid
            for other in self.groups.values()
            if other is not but and rec.idx not in other.committed and other.relevant(rec)
        ]

    def _owed_elsewhere(self, rec: Record, g: Group) -> bool:
        """Whether a group other than ``g`` still needs the record (the commit hot path)."""
        if len(self.groups) == 1:
            return False
        idx = rec.idx
        return any(
            other is not g and idx not in other.committed and other.relevant(rec)
            for other in self.groups.values()
        )

    def _settle(self, idxs: Iterable[int]) -> Durable:
        """Delete the records among ``idxs`` that some group committed and no group needs."""
        gone = [
            idx
            for idx in idxs
            if (rec := self.records.get(idx)) is not None
            and any(idx in g.committed for g in self.groups.values())
            and not self._needed_by(rec)
        ]
        if not gone:
            return None
        return self._drop(gone)[1]

    def connect(
        self, gid: str, uid: str, index: int, window: int, auto_commit: bool, tags: dict[str, str]
    ) -> tuple[Consumer, Durable]:
        """A watcher arrives. A consumer with the same uid is replaced and its records resent first."""
        g, dur = self._group(gid, index, tags)
        live_others = [c for c in g.consumers.values() if c.connected and c.uid != uid]
        if any(c.tags != tags for c in live_others):
            raise QueueError(409, f"consumers of group {gid} must use identical tags", "tags")
        if g.tags != tags:
            dur = _last([dur, self._refilter(g, tags)])
        self._conn_seq += 1
        c = Consumer(gid, uid, window, auto_commit, dict(tags), self._conn_seq)
        old = g.consumers.get(uid)
        if old is not None:
            old.connected = False
            old.wake = None
            keep = sorted(old.pending)
            if not auto_commit and len(keep) > window:
                # Reconnected with a smaller window: the excess goes back to the group.
                keep, excess = keep[:window], keep[window:]
                for idx in excess:
                    g.pending.pop(idx, None)
                    self._hand_back(g, idx)
            c.pending = dict.fromkeys(keep)
            c.resend = list(keep)
            c.delivered = old.delivered
        g.consumers[uid] = c
        return c, dur

    def _hand_back(self, g: Group, idx: int) -> None:
        """A record left its consumer: the group delivers it again if its filter still wants it
        (if not, a later filter change rescans it). Indexes at or above the cursor (after a
        filter change) are left to the scan, so the heap only holds indexes below it."""
        rec = self.records.get(idx)
        if rec is not None and idx < g.cursor and g.relevant(rec) and idx not in g.committed:
            heapq.heappush(g.returned, idx)

    def disconnect(self, c: Consumer) -> None:
        """The consumer's connection is gone; with no grace its records go back to the group at once."""
        g = self.groups.get(c.gid)
        if g is None or g.consumers.get(c.uid) is not c:
            return  # replaced by a newer connection of the same uid
        c.connected = False
        c.wake = None
        c.last_seen = time.monotonic()
        if self.grace_s <= 0:
            self.release(c)

    def release(self, c: Consumer) -> None:
        """Give a gone consumer's outstanding records back to its group (grace expired)."""
        g = self.groups.get(c.gid)
        if g is None or g.consumers.get(c.uid) is not c or c.connected:
            return
        back = [idx for idx in c.pending if g.pending.pop(idx, None) is not None]
        for idx in back:
            self._hand_back(g, idx)
        c.pending.clear()
        c.resend.clear()
        del g.consumers[c.uid]
        # Held through a filter change, some may be needed by no group any more.
        self._settle(back)
        self._wake_group(g)

    def take(self, c: Consumer, limit: int | None = None) -> tuple[list[tuple[Record, int]], Durable]:
        """Assign records to a connected consumer up to its free window.

        Returns (record, delivery_count) pairs to send in order. With auto_commit the
        records are committed as they are handed out.
        """
        g = self.groups[c.gid]
        if not c.connected or g.consumers.get(c.uid) is not c:
            return [], None
        room = c.room if limit is None else min(c.room, limit)
        out: list[tuple[Record, int]] = []
        # 1. records this uid held on its previous connection (they already count in its window)
        while c.resend:
            idx = c.resend.pop(0)
            rec = self.records.get(idx)
            if rec is not None and g.pending.get(idx) == c.uid:
                out.append((rec, self._count(g, idx)))
        if out:
            self.redeliveries_total += len(out)
            return out, None
        if room <= 0:
            return [], None
        fresh: list[Record] = []
        # 2. records returned by consumers that left (only ones the group's filter wants are
        # handed back, and a filter change empties the heap; one that does not match this
        # consumer is kept for another, never dropped)
        skipped: list[int] = []
        while g.returned and len(fresh) < room:
            idx = heapq.heappop(g.returned)
            rec = self.records.get(idx)
            if rec is None or idx in g.pending or idx in g.committed:
                continue
            if not _matches(c.tags, rec.tags) or not g.relevant(rec):
                skipped.append(idx)
                continue
            fresh.append(rec)
            self.redeliveries_total += 1
        for idx in skipped:
            heapq.heappush(g.returned, idx)
        # 3. never-delivered records, in index order
        while len(fresh) < room and g.cursor < self.visible_next:
            idx = g.cursor
            g.cursor += 1
            rec = self.records.get(idx)
            if rec is None or idx in g.pending or idx in g.committed or not g.relevant(rec):
                continue
            fresh.append(rec)
        if not fresh:
            return [], None
        if g.cursor < self.min_live:
            g.cursor = self.min_live
        dur: Durable = None
        if c.auto_commit:
            c.delivered += len(fresh)
            out = [(rec, self._count(g, rec.idx)) for rec in fresh]
            dur = self._commit_group(g, [rec.idx for rec in fresh])
            return out, dur
        for rec in fresh:
            g.pending[rec.idx] = c.uid
            c.pending[rec.idx] = None
            out.append((rec, self._count(g, rec.idx)))
        c.delivered += len(fresh)
        return out, None

    def _count(self, g: Group, idx: int) -> int:
        n = g.deliveries.get(idx, 0) + 1
        g.deliveries[idx] = n
        return n

    # ------------------------------------------------------------------ commit
    def commit(self, gid: str, idxs: list[int]) -> Durable:
        """Acknowledge for ``gid``. Validates everything first: an error changes nothing.

        An index no longer in the queue but remembered as removed is OK (idempotent). A gid
        that has no group (it never watched) acknowledges outside any group: a record read
        by a get (or recovered) is deleted if no group needs it, else refused naming the
        groups; no group is created."""
        g = self.groups.get(gid)
        live: list[int] = []
        for idx in idxs:
            rec = self.records.get(idx)
            if rec is None:
                if idx in self.recent:
                    continue  # committed, deleted or consumed already: idempotent
                raise QueueError(404, f"index {idx} is not in the queue (never put)", "_indexes_")
            live.append(idx)
            if g is not None and (idx in g.pending or idx in g.committed or idx in g.deliveries):
                continue  # delivered to this group (even if its consumer has left since)
            if not (rec.fetched or idx < self.recovered_below):
                raise QueueError(404, f"index {idx} was never delivered to group {gid}", "_indexes_")
            if g is None and (owed := self._needed_by(rec)):
                raise QueueError(
                    404,
                    f"group {gid} has never watched queue {self.name}, and index {idx} is still owed "
                    f"to group {', '.join(owed)}: commit with the gid that received it",
                    "_indexes_",
                )
        if g is None:
            n, dur = self._drop(live)  # nobody needs them: the commit deletes
            self.commits_total += n
            return dur
        return self._commit_group(g, live)

    def _commit_group(self, g: Group, idxs: Iterable[int]) -> Durable:
        to_delete: list[int] = []
        to_ack: list[int] = []
        for idx in idxs:
            rec = self.records.get(idx)
            if rec is None or idx in g.committed:
                continue
            uid = g.pending.pop(idx, None)
            if uid is not None:
                c = g.consumers.get(uid)
                if c is not None:
                    c.pending.pop(idx, None)
                    self._wake(c)
            self.commits_total += 1
            if not self._owed_elsewhere(rec, g):
                to_delete.append(idx)
            else:
                g.committed.add(idx)
                to_ack.append(idx)
        durs: list[Durable] = []
        if to_delete:
            durs.append(self._drop(to_delete)[1])
        if to_ack:
            durs.append(self.backend.ack(self.name, g.gid, to_ack))
        return _last(durs)

    # ------------------------------------------------------------------ search / attributes
    def search(self, gid: str, idx: int) -> dict[str, Any] | None:
        rec = self.records.get(idx)
        if rec is None:
            return None
        g = self.groups.get(gid)
        if g is None:
            ahead = sum(1 for i in self.records if i < idx)
            return {"ConsumerId": "", "IsPending": False, "WaitCount": ahead}
        uid = g.pending.get(idx)
        if uid is not None:
            return {"ConsumerId": f"{gid}.{uid}", "IsPending": True, "WaitCount": 0}
        returned = set(g.returned)
        ahead = sum(
            1
            for i, r in self.records.items()
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
            slots = max(0, c.window - len(c.pending)) if not c.auto_commit else c.window
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
            "puts_total": self.puts_total,
            "commits_total": self.commits_total,
            "redeliveries_total": self.redeliveries_total,
        }


def _last(durs: Iterable[Durable]) -> Durable:
    """The backend completes its writes in order: the last handle covers all before it."""
    real = [d for d in durs if d is not None]
    return real[-1] if real else None
