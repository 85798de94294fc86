"""The record log of one queue: allocation, visibility, payloads, reads, removal and the
bounded memory of removed records.

It knows nothing of consumer groups (groups.py) nor of the journal: the store (store.py)
composes the two and journals their changes. Everything here is synchronous and never
blocks. A change that a refused write must take back hands its own undo to the store:
``take_out`` returns what it took, and ``put_back`` restores exactly that.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.config import QueueConfig
from gateway.queue.durable import Durable, Written
from gateway.queue.records import RECENT_LIMIT, QueueError, Record, matches


@dataclass(slots=True)
class Taken:
    """Records taken out of the log (in the order asked), with what they counted: the
    undo of a removal whose write the store refuses (``RecordLog.put_back``)."""

    records: list[Record]
    idxs: list[int]
    rids: list[str]
    size: int  # their payload bytes
    cached: int  # the part of them held in memory


class RecordLog:
    """The records of one queue and the figures kept on them."""

    def __init__(
        self,
        name: str,
        cfg: QueueConfig,
        read: Callable[[str, int], bytes | None] | None = None,
        free_bytes: Callable[[], int | None] | None = None,
    ) -> None:
        """``read``: reads one record's payload back from the store (SQLite), so that a
        payload may leave memory once durable; without it every payload stays in memory.
        ``free_bytes``: the store's free disk space, for the default ``max_bytes``."""
        self.name = name
        self.cfg = cfg
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
        self.recovered_below = 0
        # Called whenever records become visible (the store wakes consumers and long polls).
        self.on_visible: Callable[[], None] | None = None
        self.puts_total = 0
        # Payload bytes of the live and in-flight records (the max_bytes cap), and of the
        # payloads held in memory (the memory_bytes cap).
        self.bytes = 0
        self.cached_bytes = 0
        self._read = read
        self.max_bytes = cfg.max_bytes
        if cfg.max_bytes <= 0:
            # Default: half the disk space free now (``load`` adds what the queue holds); a
            # store without a disk of its own reports none: no byte cap.
            room = free_bytes() if free_bytes is not None else None
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
        """The record's payload, from memory or read back from the store; None once the
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

    def loaded(self, rec: Record) -> Record | None:
        """The record with its payload in hand (a copy, when read back from disk)."""
        if rec.data is not None:
            return rec
        data = self.payload(rec)
        if data is None:
            return None
        return Record(rec.idx, rec.rid, rec.tags, data, rec.fetched, rec.size)

    # ------------------------------------------------------------------ positions
    @property
    def length(self) -> int:
        return len(self.records)

    def advance_min_live(self) -> int:
        """The lowest live index (or ``visible_next`` if none): moved up past removed ones."""
        while self.min_live < self.visible_next and self.min_live not in self.records:
            self.min_live += 1
        return self.min_live

    def first_entry(self) -> int:
        self.advance_min_live()
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

    # ------------------------------------------------------------------ put
    def known(self, rid: str) -> tuple[int, Durable] | None:
        """The index of a record with this request id in the queue, being put (with the
        put's write, which no caller can cancel: durable.py) or removed recently; None if
        there is none."""
        idx = self.by_rid.get(rid)
        if idx is not None:
            return idx, None
        inflight = self.inflight_rids.get(rid)
        if inflight is not None:
            return inflight
        idx = self.recent_rids.get(rid)
        return None if idx is None else (idx, None)

    def check_size(self, size: int) -> None:
        """Refuse (413) a payload no queue of this configuration could ever hold."""
        if size > self.cfg.max_payload_bytes:
            raise QueueError(
                413, f"record of {size} bytes exceeds maxPayloadBytes {self.cfg.max_payload_bytes}"
            )
        if 0 < self.max_bytes < size:  # could never fit, however much is consumed
            raise QueueError(413, f"record of {size} bytes exceeds max_bytes {self.max_bytes}")

    def full(self) -> bool:
        """Whether the live and in-flight records fill max_length."""
        return len(self.records) + self.inflight >= self.cfg.max_length

    def over_bytes(self, size: int) -> bool:
        """Whether a payload of ``size`` bytes would pass max_bytes now."""
        return self.max_bytes > 0 and self.bytes + size > self.max_bytes

    def allocate(self, data: bytes, tags: Mapping[str, str], rid: str | None) -> Record:
        """A new record with the next index, counted as in flight (the caller checked room)."""
        rid = rid or str(uuid.uuid4())
        idx = self.next_idx
        self.next_idx += 1
        tags = dict(tags)
        tags["requestId"] = rid
        rec = Record(idx, rid, tags, data)
        self.inflight += 1
        self.bytes += rec.size
        return rec

    def journalled(self, recs: list[Record], dur: Written) -> None:
        """The records' put was handed to the store: they become visible once ``dur`` completes."""
        if dur is None:
            self._puts_done(recs, True)
            return
        for rec in recs:
            self.inflight_rids[rec.rid] = (rec.idx, dur)
        dur.add_done_callback(lambda f: self._puts_done(recs, not f.cancelled() and f.exception() is None))

    def _puts_done(self, recs: list[Record], ok: bool) -> None:
        """A put's write committed (or was refused: its records never become visible)."""
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
        if ok and self.on_visible is not None:
            self.on_visible()

    # ------------------------------------------------------------------ get
    def select(self, index: int, length: int, rid: str | None, tags: Mapping[str, str]) -> list[Record]:
        """What a get returns: the record with request id ``rid``, or up to ``length``
        records from ``index`` on matching ``tags``, no more than max_get_bytes of payload
        (always at least one record)."""
        out: list[Record] = []
        if rid is not None:
            idx = self.by_rid.get(rid)
            if idx is not None and idx in self.records:
                out.append(self.records[idx])
            return out
        total = 0
        start = max(index, 1, self.advance_min_live())
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
        return out

    def below(self, index: int) -> list[int]:
        """The live indexes below ``index`` (what a truncation removes), in order."""
        self.advance_min_live()
        if self.visible_next - self.min_live <= 2 * len(self.records):
            return [i for i in range(self.min_live, min(index, self.visible_next)) if i in self.records]
        return [i for i in self.records if i < index]

    # ------------------------------------------------------------------ removal
    def take_out(self, idxs: Iterable[int]) -> Taken | None:
        """Take records out (those of ``idxs`` still here) and remember them as removed ->
        what was taken, for the journal and for ``put_back``; None if none was here. On the
        commit path, so in bulk: a commit removes up to thousands at once."""
        records: list[Record] = []
        removed: list[int] = []
        rids: list[str] = []
        size = cached = 0
        pop, forget = self.records.pop, self.by_rid.pop
        for idx in idxs:
            rec = pop(idx, None)
            if rec is None:
                continue
            records.append(rec)
            removed.append(idx)
            rids.append(rec.rid)
            forget(rec.rid, None)
            size += rec.size
            if rec.data is not None:
                cached += rec.size
        if not removed:
            return None
        self.bytes -= size
        self.cached_bytes -= cached
        self._remember(removed, rids)
        lo, hi = min(removed), max(removed)
        if hi - lo == len(removed) - 1 and lo <= self.min_live <= hi:
            self.min_live = hi + 1  # a run from the front (the usual commit): past it at once
        self.advance_min_live()  # the store may drop everything below it at once
        return Taken(records, removed, rids, size, cached)

    def put_back(self, taken: Taken) -> list[int]:
        """Undo ``take_out`` (its write was refused) -> the indexes back, in index order."""
        back: list[int] = []
        for rec in taken.records:
            idx = rec.idx
            if idx in self.records:
                continue
            self.records[idx] = rec
            self.by_rid[rec.rid] = idx
            self.bytes += rec.size
            if rec.data is not None:
                self.cached_bytes += rec.size
            if self.recent.get(idx) == rec.rid:
                del self.recent[idx]
                if self.recent_rids.get(rec.rid) == idx:
                    del self.recent_rids[rec.rid]
            self.min_live = min(self.min_live, idx)
            back.append(idx)
        back.sort()
        if back and max(self.records) > back[0]:
            # Back in index order: gets and truncation walk the records in insertion order.
            ordered = sorted(self.records.items())
            self.records.clear()
            self.records.update(ordered)
        return back


__all__ = ["RecordLog", "Taken"]
