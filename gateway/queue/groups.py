"""Consumer groups over the record log: watches, windows, hand-out, hand-back and commits.

A group (the gid header) delivers each relevant record to one of its consumers (uid) at a
time and forgets it once committed; a record is deleted once every group it is relevant to
has committed it. See ``store.py`` for the whole model.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable

from gateway.queue.recordlog import RecordLog
from gateway.queue.records import (
    AUTO_COMMIT_BYTES,
    Consumer,
    Durable,
    Group,
    QueueError,
    Record,
    last_durable,
    matches,
)
from gateway.queue.undo import Assignments, on_failure


class ConsumerGroups(RecordLog):
    """The consumer-group half of a queue (``store.Queue`` is the whole)."""

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
        return last_durable(durs)

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
            dur = last_durable([dur, self._refilter(g, tags)])
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
        c.last_seen = g.last_seen = time.monotonic()
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
        # An auto-commit hand-out deletes its records before they are written: it takes what
        # it can hold in memory (see AUTO_COMMIT_BYTES), a plain one the window.
        budget = AUTO_COMMIT_BYTES if c.auto_commit else float("inf")
        spent = 0
        # 2. records returned by consumers that left (only ones the group's filter wants are
        # handed back, and a filter change empties the heap; one that does not match this
        # consumer is kept for another, never dropped)
        skipped: list[int] = []
        while g.returned and len(fresh) < room and spent < budget:
            idx = heapq.heappop(g.returned)
            rec = self.records.get(idx)
            if rec is None or idx in g.pending or idx in g.committed:
                continue
            if not matches(c.tags, rec.tags) or not g.relevant(rec):
                skipped.append(idx)
                continue
            fresh.append(rec)
            spent += rec.size
            self.redeliveries_total += 1
        for idx in skipped:
            heapq.heappush(g.returned, idx)
        # 3. never-delivered records, in index order
        while len(fresh) < room and g.cursor < self.visible_next and spent < budget:
            idx = g.cursor
            g.cursor += 1
            rec = self.records.get(idx)
            if rec is None or idx in g.pending or idx in g.committed or not g.relevant(rec):
                continue
            fresh.append(rec)
            spent += rec.size
        if not fresh:
            return [], None
        if g.cursor < self.min_live:
            g.cursor = self.min_live
        dur: Durable = None
        if c.auto_commit:
            # With their payloads in hand: the commit removes them from disk.
            idxs = [rec.idx for rec in fresh]
            try:
                fresh = [loaded for rec in fresh if (loaded := self._loaded(rec)) is not None]
            except Exception:
                for idx in idxs:  # unreadable now: the group keeps them for a later hand-out
                    self._hand_back(g, idx)
                raise
            c.delivered += len(fresh)
            out = [(rec, self._count(g, rec.idx)) for rec in fresh]
            dur = self._commit_group(g, idxs)
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
        if g is not None and (live := self._delivered(g, idxs)) is not None:
            return self._commit_group(g, live)
        live = []
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

    def _delivered(self, g: Group, idxs: list[int]) -> list[int] | None:
        """The usual commit, checked in bulk: every index live and handed out to ``g``
        (delivered, pending or committed by it) -> the indexes; None if any is not, for
        ``commit``'s own loop to accept or refuse index by index."""
        ids = set(idxs)
        if not ids <= self.records.keys():
            return None
        # set.difference(dict) looks each index up; ``-=`` would walk the whole window.
        ids = ids.difference(g.deliveries)
        if ids:
            ids = ids.difference(g.committed).difference(g.pending)
        return None if ids else idxs

    def _commit_group(self, g: Group, idxs: Iterable[int]) -> Durable:
        records, committed = self.records, g.committed
        if len(self.groups) == 1:  # no other group owes anything: what this one commits goes
            gone = [idx for idx in idxs if idx in records and idx not in committed]
            self.commits_total += len(gone)
            return self._drop(gone)[1] if gone else None
        to_delete: list[int] = []
        to_ack: list[int] = []
        held: list[tuple[int, str | None]] = []
        freed: dict[Consumer, int] = {}
        for idx in idxs:
            rec = self.records.get(idx)
            if rec is None or idx in g.committed:
                continue
            self.commits_total += 1
            if not self._owed_elsewhere(rec, g):
                to_delete.append(idx)  # _drop unassigns it (and its undo knows who held it)
            else:
                held.append((idx, g.pending.get(idx)))
                self._unassign(g, idx, freed)
                g.committed.add(idx)
                to_ack.append(idx)
        durs: list[Durable] = []
        if to_delete:
            durs.append(self._drop(to_delete)[1])
        if to_ack:
            acked = self.backend.ack(self.name, g.gid, to_ack)
            self._offer_room(freed, acked)
            durs.append(acked)
        dur = last_durable(durs)
        if held:
            undo = Assignments(g, held)
            on_failure(dur, lambda: undo.restore(self))  # refused: uncommitted, held as before
        return dur
