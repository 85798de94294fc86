"""Stateful property test: the queue store against a reference model.

Hypothesis drives put / get / connect / take (a watch delivering) / commit / delete /
truncate / disconnect over two groups and three consumers, and after every step
checks the invariants the queue promises: no loss, exclusive in-group delivery,
window, idempotent commit, ordering of first deliveries, index uniqueness, and
attribute consistency.

Records carry a tag ``t`` (``a`` or ``b``) and consumers watch with a tag filter (none,
``t=a`` or ``t=b``): a group's filter changes when a consumer with other tags connects
while no consumer of the group is connected (a live one with other tags is a 409), and a
record matters to a group only while it matches the group's filter. Commits also come
from a group that never watched (``g3``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gateway.config import QueueConfig
from gateway.queue import groups_admin
from gateway.queue.http import HEADER_NAMES
from gateway.queue.store import Consumer, MemoryBackend, Queue, QueueError

CONSUMERS = [("g1", "u1"), ("g1", "u2"), ("g2", "u3")]
COMMITTERS = [*CONSUMERS, ("g3", "u4")]  # g3 never watches
FILTERS: list[dict[str, str]] = [{}, {"t": "a"}, {"t": "b"}]


def _matches(want: dict[str, str], tag: str) -> bool:
    return all(k == "t" and v == tag for k, v in want.items())


@dataclass
class ModelGroup:
    tags: dict[str, str] = field(default_factory=dict)
    committed: set[int] = field(default_factory=set)  # live records this group committed
    outstanding: dict[int, str] = field(default_factory=dict)  # idx -> uid
    delivered: set[int] = field(default_factory=set)  # ever delivered in this group
    released: set[int] = field(default_factory=set)  # came back from a consumer that left


class QueueMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.q = Queue("q", QueueConfig(max_length=50, max_window=8), MemoryBackend(), grace_s=0)
        self.live: dict[int, tuple[str, bytes, str]] = {}  # idx -> (rid, data, tag t)
        self.next_idx = 1
        self.groups: dict[str, ModelGroup] = {}
        self.conns: dict[tuple[str, str], Consumer] = {}
        self.last_fresh: dict[tuple[str, str], int] = {}
        self.removed: set[int] = set()  # in the queue once, gone now (committed, deleted, ...)
        self.fetched: set[int] = set()
        self.recovered_below = 0  # records below it may have been read before a restart

    # ------------------------------------------------------------------ helpers
    def _relevant(self, g: ModelGroup, idx: int) -> bool:
        return _matches(g.tags, self.live[idx][2])

    def _remove(self, idx: int) -> None:
        if idx in self.live:
            self.removed.add(idx)
        self.live.pop(idx, None)
        self.fetched.discard(idx)
        for g in self.groups.values():
            g.committed.discard(idx)
            g.outstanding.pop(idx, None)

    @property
    def _read(self) -> set[int]:
        """Records any group may commit: read by a get, or recovered (perhaps read before)."""
        return self.fetched | {i for i in self.live if i < self.recovered_below}

    def _done_everywhere(self, idx: int, but: ModelGroup | None = None) -> bool:
        return all(
            other is but or idx in other.committed or not self._relevant(other, idx)
            for other in self.groups.values()
        )

    def _group_commit(self, gid: str, idx: int) -> None:
        g = self.groups[gid]
        if idx not in self.live or idx in g.committed:
            return
        g.outstanding.pop(idx, None)
        if self._done_everywhere(idx, but=g):
            self._remove(idx)
        else:
            g.committed.add(idx)

    def _settle(self) -> None:
        """A filter changed: records some group committed that no group needs any more go."""
        for idx in sorted({i for g in self.groups.values() for i in g.committed}):
            if idx in self.live and self._done_everywhere(idx):
                self._remove(idx)

    # ------------------------------------------------------------------ rules
    @rule(data=st.binary(max_size=8), tag=st.sampled_from(["a", "b"]))
    def put(self, data: bytes, tag: str) -> None:
        try:
            idx, rid, dur = self.q.put(data, {"t": tag}, None)
        except QueueError as err:
            assert err.status == 429 and len(self.live) >= 50
            return
        assert dur is None and idx == self.next_idx  # indexes strictly increase, never reused
        self.next_idx += 1
        self.live[idx] = (rid, data, tag)

    @rule(index=st.integers(0, 60), length=st.integers(1, 5), auto_delete=st.booleans())
    def get(self, index: int, length: int, auto_delete: bool) -> None:
        recs, _ = self.q.get(index, length, auto_delete, None, {})
        expected = [i for i in sorted(self.live) if i >= max(index, 1)][:length]
        assert [r.idx for r in recs] == expected
        for r in recs:
            assert (r.rid, r.data, r.tags["t"]) == self.live[r.idx] and r.tags["requestId"] == r.rid
            if auto_delete:
                self._remove(r.idx)
            else:
                self.fetched.add(r.idx)

    @rule(
        c=st.sampled_from(CONSUMERS),
        window=st.integers(1, 4),
        auto_commit=st.booleans(),
        tags=st.sampled_from(FILTERS),
    )
    def connect(self, c: tuple[str, str], window: int, auto_commit: bool, tags: dict[str, str]) -> None:
        gid, uid = c
        others = [k for k in self.conns if k[0] == gid and k != c]
        g = self.groups.get(gid)
        try:
            consumer, _ = self.q.connect(gid, uid, 0, window, auto_commit, dict(tags))
        except QueueError as err:
            assert err.status == 409, err.message
            assert g is not None and others and g.tags != tags, "409 without a live consumer of other tags"
            return
        assert not (others and g is not None and g.tags != tags), "consumers of one group with other tags"
        old = self.conns.pop(c, None)
        self.conns[c] = consumer
        if g is None:
            g = self.groups[gid] = ModelGroup(tags=dict(tags))
        elif g.tags != tags:
            # The filter changed: the group starts over from its start (first deliveries in
            # index order again) and what it no longer needs may be gone.
            g.tags = dict(tags)
            for k in list(self.last_fresh):
                if k[0] == gid:
                    del self.last_fresh[k]
            self._settle()
        # A reconnecting uid keeps what it held (resent first), up to its new window.
        held = sorted(i for i, u in g.outstanding.items() if u == uid)
        if not auto_commit and len(held) > window:
            for idx in held[window:]:
                del g.outstanding[idx]
                g.released.add(idx)
            held = held[:window]
        assert old is None or not old.connected
        assert sorted(consumer.pending) == held

    @precondition(lambda self: bool(self.conns))
    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        c = data.draw(st.sampled_from(sorted(self.conns)))
        consumer = self.conns[c]
        gid, uid = c
        g = self.groups[gid]
        out, _ = self.q.take(consumer)
        for rec, count in out:
            idx = rec.idx
            assert idx in self.live, "delivered a record that is gone"
            owner = g.outstanding.get(idx)
            assert owner in (None, uid), f"index {idx} outstanding at {owner} and delivered to {uid}"
            if owner == uid:
                continue  # resent after this uid reconnected
            assert idx not in g.committed
            assert self._relevant(g, idx), f"index {idx} does not match the filter {g.tags}"
            if idx in g.delivered:
                assert idx in g.released, f"index {idx} delivered twice without its owner leaving"
                assert count > 1
                g.released.discard(idx)
            else:
                assert count == 1
                assert idx > self.last_fresh.get(c, 0), "first deliveries out of index order"
                self.last_fresh[c] = idx
            g.delivered.add(idx)
            if consumer.auto_commit:
                self._group_commit(gid, idx)
            else:
                g.outstanding[idx] = uid

    @precondition(lambda self: bool(self.conns))
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        c = data.draw(st.sampled_from(sorted(self.conns)))
        consumer = self.conns.pop(c)
        self.q.disconnect(consumer)
        g = self.groups[c[0]]
        for idx, uid in list(g.outstanding.items()):
            if uid == c[1]:
                del g.outstanding[idx]
                g.released.add(idx)

    @rule(c=st.sampled_from(COMMITTERS), data=st.data())
    def commit(self, c: tuple[str, str], data: st.DataObject) -> None:
        gid = c[0]
        g = self.groups.get(gid)
        seen = (set(g.outstanding) | g.delivered) if g else set()
        candidates = [*sorted(seen | self.fetched), self.next_idx + 3, 1]
        idx = data.draw(st.sampled_from(candidates))
        live_before = dict(self.live)
        if idx not in self.live:
            # Gone (committed, deleted, truncated, read by get): OK; never put: 404.
            ok_expected = idx in self.removed
        elif g is not None:
            ok_expected = idx in set(g.outstanding) | g.committed | g.delivered | self._read
        else:
            # A group that never watched acks read records only once no group needs them.
            ok_expected = idx in self._read and self._done_everywhere(idx)
        try:
            self.q.commit(gid, [idx])
        except QueueError as err:
            assert not ok_expected, f"commit of {idx} by {gid} refused: {err.message}"
            assert err.status == 404
            assert set(self.q.records) == set(live_before)  # no state change
            return
        assert ok_expected, f"commit of {idx} accepted though never delivered to {gid}"
        if g is None:
            assert gid not in self.q.groups, "a commit created a group"
            self._remove(idx)
        else:
            self._group_commit(gid, idx)

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        idx = data.draw(st.sampled_from([*sorted(self.live), self.next_idx + 1]))
        self.q.delete([idx])
        self._remove(idx)

    @rule(below=st.integers(1, 60))
    def truncate(self, below: int) -> None:
        self.q.truncate(below)
        for idx in [i for i in self.live if i < below]:
            self._remove(idx)

    def _idle_groups(self) -> list[str]:
        return sorted(gid for gid in self.groups if not any(k[0] == gid for k in self.conns))

    @precondition(lambda self: bool(self._idle_groups()))
    @rule(data=st.data())
    def delete_group(self, data: st.DataObject) -> None:
        gid = data.draw(st.sampled_from(self._idle_groups()))
        g = self.groups.pop(gid)
        n, _ = groups_admin.delete_group(self.q, gid)
        for k in [k for k in self.last_fresh if k[0] == gid]:
            del self.last_fresh[k]
        # What it had not committed goes, unless another group still needs it.
        gone = [
            i for i in self.live if i not in g.committed and self._relevant(g, i) and self._done_everywhere(i)
        ]
        for idx in gone:
            self._remove(idx)
        assert n == len(gone)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def no_loss_and_consistent(self) -> None:
        if not hasattr(self, "q"):
            return
        assert set(self.q.records) == set(self.live)
        assert set(self.q.groups) == set(self.groups)
        for gid, g in self.groups.items():
            sg = self.q.groups[gid]
            assert sg.tags == g.tags
            assert sg.pending == g.outstanding
            per_uid: dict[str, set[int]] = {}
            for idx, uid in sg.pending.items():
                per_uid.setdefault(uid, set()).add(idx)
            for (cg, uid), consumer in self.conns.items():
                if cg != gid:
                    continue
                assert consumer.tags == g.tags
                assert set(consumer.pending) == per_uid.get(uid, set())
                if not consumer.auto_commit:
                    assert len(consumer.pending) <= consumer.window  # the window holds
        attrs = self.q.attributes(HEADER_NAMES, "memory")
        assert attrs["stream.length"] == str(len(self.live))
        if self.live:
            assert int(attrs["stream.firstEntry"]) == min(self.live)
            assert int(attrs["stream.firstEntry"]) <= int(attrs["stream.lastEntry"])
        assert int(attrs["stream.lastEntry"]) == self.next_idx - 1

    def teardown(self) -> None:
        # Every group gets every record it has not committed: a consumer with the group's
        # filter gets every one that matches, then one without a filter the rest (a record
        # a filter skipped is still owed once the filter changes).
        if not hasattr(self, "q"):
            return
        for gid, g in self.groups.items():
            for c in [c for c in self.conns if c[0] == gid]:
                self.q.disconnect(self.conns.pop(c))
            owed = {i: r.tags["t"] for i, r in self.q.records.items() if i not in g.committed}
            got: set[int] = set()
            for tags in (dict(g.tags), {}):
                drain, _ = self.q.connect(gid, f"drain-{tags}", 0, 8, True, dict(tags))
                for _ in range(20):
                    out, _ = self.q.take(drain)
                    if not out:
                        break
                    for r, _ in out:
                        assert _matches(tags, r.tags["t"])
                        got.add(r.idx)
                self.q.disconnect(drain)
                if tags:
                    matching = {i for i, t in owed.items() if _matches(tags, t)}
                    assert not matching - got, f"group {gid} ({tags}) never got {sorted(matching - got)}"
            missing = set(owed) - got
            assert not missing, f"group {gid} never got {sorted(missing)}"


QueueMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestQueueModel = QueueMachine.TestCase
