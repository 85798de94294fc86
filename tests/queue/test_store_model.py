"""Stateful property test: the queue store against a reference model.

Hypothesis drives put / get / connect / take (a watch delivering) / commit / delete /
truncate / disconnect over two groups and three consumers, and after every step
checks the invariants of queue-design.md: no loss, exclusive in-group delivery,
window, idempotent commit, ordering of first deliveries, index uniqueness, and
attribute consistency.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gateway.config import QueueConfig
from gateway.queue.http import HEADER_NAMES
from gateway.queue.store import Consumer, MemoryBackend, Queue, QueueError

CONSUMERS = [("g1", "u1"), ("g1", "u2"), ("g2", "u3")]


@dataclass
class ModelGroup:
    committed: set[int] = field(default_factory=set)  # live records this group committed
    outstanding: dict[int, str] = field(default_factory=dict)  # idx -> uid
    delivered: set[int] = field(default_factory=set)  # ever delivered in this group
    released: set[int] = field(default_factory=set)  # came back from a consumer that left


class QueueMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.q = Queue("q", QueueConfig(max_length=50, max_window=8), MemoryBackend(), grace_s=0)
        self.live: dict[int, tuple[str, bytes]] = {}
        self.next_idx = 1
        self.groups: dict[str, ModelGroup] = {}
        self.conns: dict[tuple[str, str], Consumer] = {}
        self.last_fresh: dict[tuple[str, str], int] = {}
        self.committed_removed: set[int] = set()
        self.fetched: set[int] = set()

    # ------------------------------------------------------------------ helpers
    def _remove(self, idx: int) -> None:
        self.live.pop(idx, None)
        self.fetched.discard(idx)
        for g in self.groups.values():
            g.committed.discard(idx)
            g.outstanding.pop(idx, None)

    def _group_commit(self, gid: str, idx: int) -> None:
        g = self.groups[gid]
        if idx not in self.live:
            return
        g.outstanding.pop(idx, None)
        g.committed.add(idx)
        if all(idx in other.committed for other in self.groups.values()):
            self._remove(idx)
            self.committed_removed.add(idx)

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
        self.live[idx] = (rid, data)

    @rule(index=st.integers(0, 60), length=st.integers(1, 5), auto_delete=st.booleans())
    def get(self, index: int, length: int, auto_delete: bool) -> None:
        recs, _ = self.q.get(index, length, auto_delete, None, {})
        expected = [i for i in sorted(self.live) if i >= max(index, 1)][:length]
        assert [r.idx for r in recs] == expected
        for r in recs:
            assert (r.rid, r.data) == self.live[r.idx] and r.tags["requestId"] == r.rid
            if auto_delete:
                self._remove(r.idx)
            else:
                self.fetched.add(r.idx)

    @rule(c=st.sampled_from(CONSUMERS), window=st.integers(1, 4), auto_commit=st.booleans())
    def connect(self, c: tuple[str, str], window: int, auto_commit: bool) -> None:
        gid, uid = c
        consumer, _ = self.q.connect(gid, uid, 0, window, auto_commit, {})
        self.conns[c] = consumer
        g = self.groups.setdefault(gid, ModelGroup())
        # A reconnecting uid keeps what it held (resent first), up to its new window.
        held = sorted(i for i, u in g.outstanding.items() if u == uid)
        if not auto_commit and len(held) > window:
            for idx in held[window:]:
                del g.outstanding[idx]
                g.released.add(idx)
            held = held[:window]
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

    @rule(c=st.sampled_from(CONSUMERS), data=st.data())
    def commit(self, c: tuple[str, str], data: st.DataObject) -> None:
        gid = c[0]
        g = self.groups.get(gid)
        candidates = [*sorted(set(g.outstanding) | g.delivered if g else set()), self.next_idx + 3, 1]
        idx = data.draw(st.sampled_from(candidates))
        live_before = dict(self.live)
        ok_expected = (
            (
                idx in self.live
                and g is not None
                and (idx in g.outstanding or idx in g.committed or idx in g.delivered)
            )
            or (idx in self.live and idx in self.fetched)
            or (idx not in self.live and idx in self.committed_removed)
        )
        try:
            self.q.commit(gid, [idx])
        except QueueError as err:
            assert not ok_expected, f"commit of {idx} refused: {err.message}"
            assert err.status == 404
            assert set(self.q.records) == set(live_before)  # no state change
            return
        assert ok_expected, f"commit of {idx} accepted though never delivered to {gid}"
        self.groups.setdefault(gid, ModelGroup())
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

    # ------------------------------------------------------------------ invariants
    @invariant()
    def no_loss_and_consistent(self) -> None:
        if not hasattr(self, "q"):
            return
        assert set(self.q.records) == set(self.live)
        for gid, g in self.groups.items():
            sg = self.q.groups.get(gid)
            assert sg is not None
            assert sg.pending == g.outstanding
            per_uid: dict[str, set[int]] = {}
            for idx, uid in sg.pending.items():
                per_uid.setdefault(uid, set()).add(idx)
            for (cg, uid), consumer in self.conns.items():
                if cg != gid:
                    continue
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
        # Every group gets every record: a fresh consumer with a big window drains the rest.
        if not hasattr(self, "q"):
            return
        for gid, g in self.groups.items():
            for c in [c for c in self.conns if c[0] == gid]:
                self.q.disconnect(self.conns.pop(c))
            drain, _ = self.q.connect(gid, "drain", 0, 8, True, {})
            got: set[int] = set()
            for _ in range(20):
                out, _ = self.q.take(drain)
                if not out:
                    break
                got.update(r.idx for r, _ in out)
            missing = {i for i in self.live if i not in g.committed} - got
            assert not missing, f"group {gid} never got {sorted(missing)}"


QueueMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestQueueModel = QueueMachine.TestCase
