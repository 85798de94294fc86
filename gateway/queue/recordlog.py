"""The record log of one queue: allocation, visibility, get, delete, truncate and the
bounded memory of removed records.

Everything here is synchronous and never blocks; where something must reach the disk
first, a method returns a ``Durable`` handle the caller awaits before answering. The
consumer groups built on this log are in ``groups.py``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gateway.config import QueueConfig
from gateway.queue.backend import Backend
from gateway.queue.records import (
    RECENT_LIMIT,
    Consumer,
    Durable,
    Group,
    QueueError,
    Record,
    every_durable,
    matches,
)
from gateway.queue.undo import Removal, on_failure

# A put on a queue at max_bytes may evict up to this many records pinned only by idle groups.
MAX_EVICTIONS_PER_PUT = 1024


class RecordLog:
    """Records of one queue and what every group sees of them (``ConsumerGroups`` adds the rest)."""

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
        # Payload bytes of the live and in-flight records (the max_bytes cap), and of the
        # payloads held in memory (the memory_bytes cap). A backend that can read one record
        # back (``read``: SQLite) lets a payload leave memory once durable; the others keep all.
        self.bytes = 0
        self.cached_bytes = 0
        self._read: Callable[[str, int], bytes | None] | None = getattr(backend, "read", None)
        self.max_bytes = cfg.max_bytes
        if cfg.max_bytes <= 0:
            # Default: half the disk space free now (``load`` adds what the queue holds); a
            # backend without a disk of its own reports none: no byte cap.
            free = getattr(backend, "free_bytes", None)
            room = free() if free is not None else None
            self.max_bytes = room // 2 if room is not None else 0

    # ------------------------------------------------------------------ recovery
    def load(self, state: Mapping[str, Any]) -> None:
        self.next_idx = max(1, int(state.get("next_idx", 1)))
        # A record is (idx, rid, tags, data) or (idx, rid, tags, None, size): the SQLite
        # store recovers metadata only and the payloads stay on disk until delivered.
        for idx, rid, tags, data, *size in state.get("records", ()):
            rec = Record(idx, rid, tags, data, size=size[0] if size else -1)
            self.bytes += rec.size
            if data is not None:
                self._cache(rec)
            self.records[idx] = rec
            self.by_rid[rid] = idx
            self.next_idx = max(self.next_idx, idx + 1)
        removed = [(idx, rid) for idx, rid in state.get("removed", ()) if idx not in self.records]
        if removed:
            self._remember([idx for idx, _ in removed], [rid for _, rid in removed])
            self.next_idx = max(self.next_idx, max(idx for idx, _ in removed) + 1)
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
        if self.cfg.max_bytes <= 0 and self.max_bytes > 0:
            self.max_bytes += self.bytes  # the default cap counts free space on top of it

    # ------------------------------------------------------------------ payloads
    def _cache(self, rec: Record) -> None:
        """A record became durable: keep its payload in memory while the cache has room."""
        if self._read is not None and self.cached_bytes + rec.size > self.cfg.memory_bytes:
            rec.data = None  # on disk only; read back when delivered
        else:
            self.cached_bytes += rec.size

    def payload(self, rec: Record) -> bytes | None:
        """The record's payload, from memory or read back from the backend; None once the
        record is gone from the store.

        The read is synchronous, in the event loop: one row by its rowid on SQLite's own
        read-only connection, at most max_payload_bytes (measured from the page cache:
        0.35 ms for 1 MiB, 7 ms for 8 MiB, less than sending it costs). An executor
        hand-off would cost a thread switch per record and let the record be removed
        between the hand-out and the read; a synchronous read cannot."""
        if rec.data is not None:
            return rec.data
        if self._read is None:
            return None
        return self._read(self.name, rec.idx)

    def _loaded(self, rec: Record) -> Record | None:
        """The record with its payload in hand (a copy, when read back from disk)."""
        if rec.data is not None:
            return rec
        data = self.payload(rec)
        if data is None:
            return None
        return Record(rec.idx, rec.rid, rec.tags, data, rec.fetched, rec.size)

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

    def _remember(self, idxs: Sequence[int], rids: Sequence[str]) -> None:
        recent, recent_rids = self.recent, self.recent_rids
        for idx, rid in zip(idxs, rids, strict=True):
            recent[idx] = rid
            recent_rids[rid] = idx
        for _ in range(len(recent) - RECENT_LIMIT):
            old_idx, old_rid = recent.popitem(last=False)
            if recent_rids.get(old_rid) == old_idx:
                del recent_rids[old_rid]

    def _drop(self, idxs: Iterable[int]) -> tuple[int, Durable]:
        """Remove records and journal it (with their tombstones); -> (how many, handle)."""
        idxs = list(idxs)
        undo = Removal(self, idxs)
        freed: dict[Consumer, int] = {}
        removed, rids, size = self._remove(idxs, freed)
        if not removed:
            return 0, None
        lo, hi = min(removed), max(removed)
        if hi - lo == len(removed) - 1 and lo <= self.min_live <= hi:
            self.min_live = hi + 1  # a run from the front (the usual commit): past it at once
        self._advance_min_live()  # the backend may drop everything below it at once
        dur = self.backend.delete(self.name, removed, rids, self.min_live, size)
        on_failure(dur, lambda: undo.restore(self))  # refused: the records are back in memory
        self._offer_room(freed, dur)
        return len(removed), dur

    def _remove(self, idxs: Iterable[int], freed: dict[Consumer, int]) -> tuple[list[int], list[str], int]:
        """Take records out of memory -> (their indexes, their request ids, their payload
        bytes); ``freed`` counts
        the records taken off each consumer. On the commit path, so in bulk: a commit removes
        up to thousands at once, and the per-group bookkeeping is set arithmetic run in C."""
        removed: list[int] = []
        rids: list[str] = []
        size = cached = 0
        pop, forget = self.records.pop, self.by_rid.pop
        for idx in idxs:
            rec = pop(idx, None)
            if rec is None:
                continue
            removed.append(idx)
            rids.append(rec.rid)
            forget(rec.rid, None)
            size += rec.size
            if rec.data is not None:
                cached += rec.size
        if not removed:
            return removed, rids, 0
        self.bytes -= size
        self.cached_bytes -= cached
        self._remember(removed, rids)
        gone = set(removed)
        for g in self.groups.values():
            g.committed -= gone
            deliveries = g.deliveries
            for idx in gone & deliveries.keys():
                del deliveries[idx]
            for idx in gone & g.pending.keys():
                self._unassign(g, idx, freed)
        return removed, rids, size

    def _unassign(self, g: Group, idx: int, freed: dict[Consumer, int]) -> None:
        """Take record ``idx`` off whichever consumer of ``g`` holds it (counted in ``freed``)."""
        uid = g.pending.pop(idx, None)
        if uid is not None:
            c = g.consumers.get(uid)
            if c is not None:
                c.pending.pop(idx, None)
                freed[c] = freed.get(c, 0) + 1

    def _offer_room(self, freed: dict[Consumer, int], dur: Durable) -> None:
        """Consumers that hold fewer records now take more once the change is durable: until
        then the records still count in their windows (``releasing``), since a refused write
        puts them back. The answer to the call that freed the room (a commit) also goes out
        before the hand-out it allows, so the client works while the server sends."""
        if not freed:
            return
        now = time.monotonic()
        for c in freed:
            c.progress = now  # committed or removed: not held any more
        if not (isinstance(dur, asyncio.Future) and not dur.done()):
            self._wake_each(freed)
            return
        for c, n in freed.items():
            c.releasing += n
        dur.add_done_callback(lambda _: self._released(freed))

    def _released(self, freed: dict[Consumer, int]) -> None:
        for c, n in freed.items():
            c.releasing -= n
        self._wake_each(freed)

    def _wake_each(self, consumers: Iterable[Consumer]) -> None:
        for c in consumers:
            self._wake(c)

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
            known = self._known(rid)
            if known is not None:
                return known[0], rid, known[1]
        rec = self._allocate(data, tags, rid)
        dur = self.backend.put(self.name, [rec], self.next_idx)
        self._journalled([rec], dur)
        return rec.idx, rec.rid, dur

    def put_many(
        self, items: Sequence[tuple[bytes, Mapping[str, str], str | None]]
    ) -> tuple[list[tuple[int, str] | QueueError], Durable]:
        """Many puts in one journal write: per item (data, tags, request id) what ``put``
        answers, its (index, request id), or the refusal ``put`` raises (full, too large),
        and one handle for them all. A request id already in the queue, being put or
        remembered as removed stores nothing, as with ``put``; the new records become
        visible together, in index order, when the write completes."""
        out: list[tuple[int, str] | QueueError] = []
        fresh: list[Record] = []
        waits: list[Durable] = []
        mine: dict[str, int] = {}  # request ids new in this call (a repeat within it stores nothing)
        for data, tags, rid in items:
            if rid:
                known = self._known(rid)
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
            dur = self.backend.put(self.name, fresh, self.next_idx)
            self._journalled(fresh, dur)
            waits.append(dur)
        return out, every_durable(waits)

    def _known(self, rid: str) -> tuple[int, Durable] | None:
        """The index of a record with this request id in the queue, being put (with the
        put's handle) or removed recently; None if there is none."""
        idx = self.by_rid.get(rid)
        if idx is not None:
            return idx, None
        inflight = self.inflight_rids.get(rid)
        if inflight is not None:
            return inflight
        idx = self.recent_rids.get(rid)
        return None if idx is None else (idx, None)

    def _allocate(self, data: bytes, tags: Mapping[str, str], rid: str | None) -> Record:
        """A new record with the next index, counted as in flight; raises what a put refuses."""
        if len(data) > self.cfg.max_payload_bytes:
            raise QueueError(
                413, f"record of {len(data)} bytes exceeds maxPayloadBytes {self.cfg.max_payload_bytes}"
            )
        if 0 < self.max_bytes < len(data):  # could never fit, however much is consumed
            raise QueueError(413, f"record of {len(data)} bytes exceeds max_bytes {self.max_bytes}")
        if len(self.records) + self.inflight >= self.cfg.max_length and not self._make_room():
            raise QueueError(429, f"queue {self.name} is full (max_length {self.cfg.max_length})")
        evictions = 0  # by the same rule as a full max_length, within a bound per put
        while self.max_bytes > 0 and self.bytes + len(data) > self.max_bytes:
            if evictions < MAX_EVICTIONS_PER_PUT and self._make_room():
                evictions += 1
                continue
            raise QueueError(
                429,
                f"queue {self.name} is full: it holds {self.bytes} payload bytes and this record of "
                f"{len(data)} would pass max_bytes {self.max_bytes}",
            )
        rid = rid or str(uuid.uuid4())
        idx = self.next_idx
        self.next_idx += 1
        tags = dict(tags)
        tags["requestId"] = rid
        rec = Record(idx, rid, tags, data)
        self.inflight += 1
        self.bytes += rec.size
        return rec

    def _journalled(self, recs: list[Record], dur: Durable) -> None:
        """The records' put was handed to the backend: they become visible once ``dur`` completes."""
        if dur is None:
            self._puts_done(recs, True)
            return
        for rec in recs:
            self.inflight_rids[rec.rid] = (rec.idx, dur)
        add_done = getattr(dur, "add_done_callback", None)
        if add_done is not None:
            add_done(lambda f: self._puts_done(recs, not f.cancelled() and f.exception() is None))

    def _puts_done(self, recs: list[Record], ok: bool) -> None:
        """Called by the durability layer when a put's write committed (or failed)."""
        for rec in recs:
            self.inflight -= 1
            self.inflight_rids.pop(rec.rid, None)
            if ok:
                self._cache(rec)
                self.records[rec.idx] = rec
                self.by_rid[rec.rid] = rec.idx
                self.puts_total += 1
            else:
                self.bytes -= rec.size
            self.visible_next = max(self.visible_next, rec.idx + 1)
        if ok:
            self._wake_all()
            if self.on_visible is not None:
                self.on_visible()

    def _make_room(self) -> bool:
        """The queue is full: free one place if the retention rules allow (store.Queue)."""
        return False

    # ------------------------------------------------------------------ get
    def get(
        self, index: int, length: int, auto_delete: bool, rid: str | None, tags: Mapping[str, str]
    ) -> tuple[list[Record], Durable]:
        """Up to ``length`` records from ``index`` on, and no more than max_get_bytes of
        payload (always at least one record), each with its payload in hand: with
        ``auto_delete`` they leave the disk as soon as the returned handle completes."""
        out: list[Record] = []
        if rid is not None:
            idx = self.by_rid.get(rid)
            if idx is not None and idx in self.records:
                out.append(self.records[idx])
        else:
            total = 0
            start = max(index, 1)
            self._advance_min_live()
            start = max(start, self.min_live)
            if self.visible_next - start <= 2 * len(self.records):
                it: Iterable[int] = range(start, self.visible_next)
            else:
                it = (i for i in self.records if i >= start)
            for i in it:
                rec = self.records.get(i)
                if rec is not None and matches(tags, rec.tags):
                    if out and total + rec.size > self.cfg.max_get_bytes:
                        break
                    total += rec.size
                    out.append(rec)
                    if len(out) >= length:
                        break
        out = [loaded for rec in out if (loaded := self._loaded(rec)) is not None]
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
