"""Consumer groups over a record log: watches, windows, hand-out, hand-back and commits.

A group (the gid header) delivers each relevant record to one of its consumers (uid) at a
time and forgets it once committed; a record is deleted once every group it is relevant to
has committed it. See ``store.py`` for the whole model.

This layer owns the groups and their consumers and only reads the record log. The store
(store.py) journals what changed and removes records; a change here that a refused write
must take back comes with its own undo (``Forgotten``, ``Uncommit``), which the store
registers on the write.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gateway.queue.durable import Durable
from gateway.queue.recordlog import RecordLog
from gateway.queue.records import AUTO_COMMIT_BYTES, Consumer, Group, QueueError, Record, matches


@dataclass(slots=True)
class Forgotten:
    """What removing some records changed in the groups: per group touched, the indexes it
    had committed, the uid each held one at (None: none did) and their delivery counts.
    ``ConsumerGroups.restore`` puts it back."""

    idxs: list[int]
    groups: list[tuple[Group, set[int], dict[int, str], dict[int, int]]]


@dataclass(slots=True)
class Uncommit:
    """The records a commit acknowledged for a group (other groups still need them), with the
    uid that held each (None: none did): ``ConsumerGroups.uncommit`` puts them back."""

    group: Group
    held: list[tuple[int, str | None]]


@dataclass(slots=True)
class CommitPlan:
    """A commit in one group that other groups do not all share: the records it deletes,
    and the ones it acknowledges (already marked committed, taken off their consumers)."""

    delete: list[int]
    ack: list[int]
    freed: dict[Consumer, int]
    undo: Uncommit | None


class ConsumerGroups:
    """The groups of one queue and their consumers, over its record log."""

    def __init__(self, log: RecordLog, grace_s: float) -> None:
        self.log = log
        self.grace_s = grace_s
        self.groups: dict[str, Group] = {}
        self._conn_seq = 0
        self.redeliveries_total = 0

    # ------------------------------------------------------------------ recovery
    def load(
        self, groups: Iterable[tuple[str, int, Mapping[str, str]]], acks: Iterable[tuple[str, int]]
    ) -> None:
        """The groups (gid, start, tags) and acknowledgements (gid, index) the store recovered."""
        min_live = self.log.min_live
        for gid, start, tags in groups:
            self.groups[gid] = Group(gid, start, dict(tags), cursor=max(start, min_live))
        records = self.log.records
        for gid, idx in acks:
            g = self.groups.get(gid)
            if g is not None and idx in records:
                g.committed.add(idx)

    # ------------------------------------------------------------------ groups
    def ensure(self, gid: str, start: int, tags: dict[str, str]) -> tuple[Group, bool]:
        """The group, made if it does not exist yet -> (group, whether it is new)."""
        g = self.groups.get(gid)
        if g is not None:
            return g, False
        start = max(start, 1)
        g = Group(gid, start, dict(tags), cursor=max(start, self.log.advance_min_live()))
        self.groups[gid] = g
        return g, True

    def refilter(self, g: Group, tags: dict[str, str]) -> None:
        """The group's tag filter changes (no consumer of it is connected).

        The group scans its records again from its start: records the old filter skipped
        (or handed back) are delivered once they match, and committed or still pending
        ones are skipped as usual. (Records it no longer needs and every other group has
        committed are for the store to delete: ``settleable``.)"""
        g.tags = dict(tags)
        g.cursor = max(g.start, self.log.advance_min_live())
        g.returned = []  # the rescan covers them

    def revert(self, gid: str, tags: dict[str, str] | None) -> None:
        """Undo a watch's ``ensure`` or ``refilter`` (``tags``: the filter before; None: the
        group is new) unless another consumer joined meanwhile: a new group goes, an old
        one has its filter back (the rescan the change began does no harm)."""
        g = self.groups.get(gid)
        if g is None or g.consumers:
            return
        if tags is None:
            del self.groups[gid]
        else:
            g.tags = dict(tags)

    def remove(self, gid: str) -> Group:
        """Forget a group -> the group, for ``put_back``."""
        return self.groups.pop(gid)

    def put_back(self, g: Group) -> None:
        """Undo ``remove`` (its write was refused)."""
        self.groups.setdefault(g.gid, g)

    def acked(self) -> list[int]:
        """Live records some group committed (and some other group has not)."""
        out: set[int] = set()
        for g in self.groups.values():
            out.update(g.committed)
        return sorted(out)

    def needed_by(self, rec: Record, but: Group | None = None) -> list[str]:
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

    def settleable(self, idxs: Iterable[int]) -> list[int]:
        """The records among ``idxs`` that some group committed and no group needs."""
        records = self.log.records
        return [
            idx
            for idx in idxs
            if (rec := records.get(idx)) is not None
            and any(idx in g.committed for g in self.groups.values())
            and not self.needed_by(rec)
        ]

    def lag(self, g: Group) -> int:
        """Live records the group still needs."""
        return sum(1 for idx, rec in self.log.records.items() if idx not in g.committed and g.relevant(rec))

    def owned_only_by(self, g: Group) -> list[int]:
        """Live records ``g`` still needs and no other group does (what deleting it frees)."""
        return [
            idx
            for idx, rec in self.log.records.items()
            if idx not in g.committed and g.relevant(rec) and not self.needed_by(rec, but=g)
        ]

    # ------------------------------------------------------------------ consumers
    def attach(self, g: Group, uid: str, window: int, auto_commit: bool, tags: dict[str, str]) -> Consumer:
        """A watcher of ``g`` arrives. A consumer with the same uid is replaced and its
        records resent first."""
        self._conn_seq += 1
        c = Consumer(g.gid, uid, window, auto_commit, dict(tags), self._conn_seq)
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
        return c

    def check_tags(self, gid: str, uid: str, tags: dict[str, str]) -> None:
        """The connected consumers of a group share one tag filter (409 otherwise)."""
        g = self.groups.get(gid)
        if g is not None and any(
            c.tags != tags for c in g.consumers.values() if c.connected and c.uid != uid
        ):
            raise QueueError(409, f"consumers of group {gid} must use identical tags", "tags")

    def _hand_back(self, g: Group, idx: int) -> None:
        """A record left its consumer: the group delivers it again if its filter still wants it
        (if not, a later filter change rescans it). Indexes at or above the cursor (after a
        filter change) are left to the scan, so the heap only holds indexes below it."""
        rec = self.log.records.get(idx)
        if rec is not None and idx < g.cursor and g.relevant(rec) and idx not in g.committed:
            heapq.heappush(g.returned, idx)

    def disconnect(self, c: Consumer) -> bool:
        """The consumer's connection is gone -> whether its records go back now (no grace)."""
        g = self.groups.get(c.gid)
        if g is None or g.consumers.get(c.uid) is not c:
            return False  # replaced by a newer connection of the same uid
        c.connected = False
        c.wake = None
        c.last_seen = g.last_seen = time.monotonic()
        return self.grace_s <= 0

    def release(self, c: Consumer) -> list[int] | None:
        """Give a gone consumer's outstanding records back to its group (grace expired) ->
        the indexes given back (None: nothing to do)."""
        g = self.groups.get(c.gid)
        if g is None or g.consumers.get(c.uid) is not c or c.connected:
            return None
        back = [idx for idx in c.pending if g.pending.pop(idx, None) is not None]
        for idx in back:
            self._hand_back(g, idx)
        c.pending.clear()
        c.resend.clear()
        del g.consumers[c.uid]
        self.wake_group(g)
        return back

    def take(self, c: Consumer, limit: int | None = None) -> tuple[list[tuple[Record, int]], list[int]]:
        """Assign records to a connected consumer up to its free window.

        Returns (record, delivery_count) pairs to send in order, and with auto_commit the
        indexes the store commits as they are handed out (else an empty list)."""
        g = self.groups[c.gid]
        if not c.connected or g.consumers.get(c.uid) is not c:
            return [], []
        room = c.room if limit is None else min(c.room, limit)
        out: list[tuple[Record, int]] = []
        records = self.log.records
        # 1. records this uid held on its previous connection (they already count in its window)
        while c.resend:
            idx = c.resend.pop(0)
            rec = records.get(idx)
            if rec is not None and g.pending.get(idx) == c.uid:
                out.append((rec, self._count(g, idx)))
        if out:
            self.redeliveries_total += len(out)
            return out, []
        if room <= 0:
            return [], []
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
            rec = records.get(idx)
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
        visible_next = self.log.visible_next
        while len(fresh) < room and g.cursor < visible_next and spent < budget:
            idx = g.cursor
            g.cursor += 1
            rec = records.get(idx)
            if rec is None or idx in g.pending or idx in g.committed or not g.relevant(rec):
                continue
            fresh.append(rec)
            spent += rec.size
        if not fresh:
            return [], []
        if g.cursor < self.log.min_live:
            g.cursor = self.log.min_live
        if c.auto_commit:
            # With their payloads in hand: the commit removes them from disk.
            idxs = [rec.idx for rec in fresh]
            try:
                fresh = [loaded for rec in fresh if (loaded := self.log.loaded(rec)) is not None]
            except Exception:
                for idx in idxs:  # unreadable now: the group keeps them for a later hand-out
                    self._hand_back(g, idx)
                raise
            c.delivered += len(fresh)
            return [(rec, self._count(g, rec.idx)) for rec in fresh], idxs
        for rec in fresh:
            g.pending[rec.idx] = c.uid
            c.pending[rec.idx] = None
            out.append((rec, self._count(g, rec.idx)))
        c.delivered += len(fresh)
        return out, []

    def _count(self, g: Group, idx: int) -> int:
        n = g.deliveries.get(idx, 0) + 1
        g.deliveries[idx] = n
        return n

    # ------------------------------------------------------------------ commit
    def check_commit(self, gid: str, idxs: list[int]) -> list[int]:
        """Validate a commit by ``gid`` (an error changes nothing) -> the live indexes it
        commits. An index no longer in the queue but remembered as removed is OK
        (idempotent). A gid that has no group (it never watched) acknowledges outside any
        group: a record read by a get (or recovered) may go if no group needs it, else
        refused naming the groups; no group is created."""
        g = self.groups.get(gid)
        if g is not None and (live := self._delivered(g, idxs)) is not None:
            return live
        log = self.log
        live = []
        for idx in idxs:
            rec = log.records.get(idx)
            if rec is None:
                if idx in log.recent:
                    continue  # committed, deleted or consumed already: idempotent
                raise QueueError(404, f"index {idx} is not in the queue (never put)", "_indexes_")
            live.append(idx)
            if g is not None and (idx in g.pending or idx in g.committed or idx in g.deliveries):
                continue  # delivered to this group (even if its consumer has left since)
            if not (rec.fetched or idx < log.recovered_below):
                raise QueueError(404, f"index {idx} was never delivered to group {gid}", "_indexes_")
            if g is None and (owed := self.needed_by(rec)):
                raise QueueError(
                    404,
                    f"group {gid} has never watched queue {log.name}, and index {idx} is still owed "
                    f"to group {', '.join(owed)}: commit with the gid that received it",
                    "_indexes_",
                )
        return live

    def _delivered(self, g: Group, idxs: list[int]) -> list[int] | None:
        """The usual commit, checked in bulk: every index live and handed out to ``g``
        (delivered, pending or committed by it) -> the indexes; None if any is not, for
        ``check_commit``'s own loop to accept or refuse index by index."""
        ids = set(idxs)
        if not ids <= self.log.records.keys():
            return None
        # set.difference(dict) looks each index up; ``-=`` would walk the whole window.
        ids = ids.difference(g.deliveries)
        if ids:
            ids = ids.difference(g.committed).difference(g.pending)
        return None if ids else idxs

    def commit_in(self, g: Group, idxs: Iterable[int]) -> CommitPlan:
        """A commit in ``g``: the records no other group needs are for the store to delete;
        the others are acknowledged here at once (committed, off their consumers), with
        the undo of that."""
        records = self.log.records
        if len(self.groups) == 1:  # no other group owes anything: what this one commits goes
            committed = g.committed
            return CommitPlan([idx for idx in idxs if idx in records and idx not in committed], [], {}, None)
        delete: list[int] = []
        ack: list[int] = []
        held: list[tuple[int, str | None]] = []
        freed: dict[Consumer, int] = {}
        for idx in idxs:
            rec = records.get(idx)
            if rec is None or idx in g.committed:
                continue
            if not self._owed_elsewhere(rec, g):
                delete.append(idx)  # its removal unassigns it (and ``forget`` knows who held it)
            else:
                held.append((idx, g.pending.get(idx)))
                self._unassign(g, idx, freed)
                g.committed.add(idx)
                ack.append(idx)
        return CommitPlan(delete, ack, freed, Uncommit(g, held) if held else None)

    def uncommit(self, undo: Uncommit) -> None:
        """Undo a commit's acknowledgements (its write was refused): held as before."""
        g = undo.group
        if self.groups.get(g.gid) is not g:
            return  # deleted meanwhile
        g.committed.difference_update(idx for idx, _ in undo.held)
        self._give_back(g, undo.held)
        self.wake_group(g)

    # ------------------------------------------------------------------ removal
    def forget(self, idxs: list[int]) -> tuple[Forgotten, dict[Consumer, int]]:
        """Records left the log: every group forgets them -> the undo, and the records taken
        off each consumer. On the commit path, so in bulk: set arithmetic run in C."""
        gone = set(idxs)
        touched: list[tuple[Group, set[int], dict[int, str], dict[int, int]]] = []
        freed: dict[Consumer, int] = {}
        for g in self.groups.values():
            deliveries = g.deliveries
            delivered = gone & deliveries.keys()  # every record handed out (pending ones too)
            committed = gone & g.committed
            held = gone & g.pending.keys()
            if not (delivered or committed or held):
                continue
            pending = {i: g.pending[i] for i in held}
            touched.append((g, committed, pending, {i: deliveries[i] for i in delivered}))
            g.committed -= committed
            for idx in delivered:
                del deliveries[idx]
            for idx in pending:
                self._unassign(g, idx, freed)
        return Forgotten(idxs, touched), freed

    def restore(self, forgotten: Forgotten) -> None:
        """Undo ``forget`` (the removal's write was refused; the log has the records back):
        each group has them as before, a record whose consumer is gone meanwhile goes back
        to its group, so none is stranded."""
        records = self.log.records
        back = sorted(idx for idx in forgotten.idxs if idx in records)
        held: dict[int, dict[int, str]] = {}
        for g, committed, pending, deliveries in forgotten.groups:
            g.committed.update(i for i in committed if i in records)
            g.deliveries.update(deliveries)
            held[id(g)] = pending
        for g in self.groups.values():
            pending = held.get(id(g), {})
            self._give_back(g, ((idx, pending.get(idx)) for idx in back))
        self.wake_all()

    def _unassign(self, g: Group, idx: int, freed: dict[Consumer, int]) -> None:
        """Take record ``idx`` off whichever consumer of ``g`` holds it (counted in ``freed``)."""
        uid = g.pending.pop(idx, None)
        if uid is not None:
            c = g.consumers.get(uid)
            if c is not None:
                c.pending.pop(idx, None)
                freed[c] = freed.get(c, 0) + 1

    def _give_back(self, g: Group, held: Iterable[tuple[int, str | None]]) -> None:
        """Records back in the queue, each with the uid that held it (None: none did), back in
        ``g`` unless it has them (held, committed, or among its returned records, where a
        removal leaves them): to that consumer if it is still there (an auto-commit one holds
        those it held on a plain connection before), else to the group."""
        records = self.log.records
        queued = set(g.returned)
        for idx, uid in held:
            if idx not in records or idx in g.committed or idx in g.pending or idx in queued:
                continue
            c = g.consumers.get(uid) if uid is not None else None
            if c is not None and c.connected:
                g.pending[idx] = c.uid
                c.pending[idx] = None
            else:
                self._hand_back(g, idx)

    # ------------------------------------------------------------------ waking consumers
    def offer_room(self, freed: dict[Consumer, int], dur: Durable) -> None:
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
            self.wake(c)

    def wake(self, c: Consumer) -> None:
        if c.connected and c.wake is not None and c.room > 0:
            c.wake()

    def wake_group(self, g: Group) -> None:
        for c in g.consumers.values():
            self.wake(c)

    def wake_all(self) -> None:
        for g in self.groups.values():
            self.wake_group(g)


__all__ = ["CommitPlan", "ConsumerGroups", "Forgotten", "Uncommit"]
