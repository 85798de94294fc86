"""The reference-model test again, with removals the store refuses to write.

Besides every step of ``QueueMachine``, Hypothesis now puts, commits, deletes, truncates
and reads with auto-delete while the backend refuses the write (a full disk, a Redis refusing
writes). Each refused call must leave the queue exactly as it was: records, byte counts,
the memory of removed records, every group's pending, committed and delivery counts, and
every consumer's window; the model does not change, so the machine's invariants and its
final drain check the store against it after each refusal.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from gateway.config import QueueConfig
from gateway.queue.backend import StorageError
from gateway.queue.durable import Write
from gateway.queue.records import Record
from gateway.queue.store import MemoryBackend, Queue, QueueError
from tests.gateway.queue.test_store_model import COMMITTERS, QueueMachine


class RefusingBackend(MemoryBackend):
    """Accepts every write at once, except while ``refusing``: then each removal or
    acknowledgement is a pending write that ``refuse_all`` fails."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.refusing = False
        self.writes: list[Write] = []

    def _write(self) -> Write | None:
        if not self.refusing:
            return None
        fut = Write(loop=self.loop)
        self.writes.append(fut)
        return fut

    def put(self, queue: str, records: list[Record], next_idx: int) -> Any:
        return self._write()

    def delete(
        self, queue: str, idxs: list[int], rids: list[str] | None = None, floor: int = 0, size: int = -1
    ) -> Any:
        return self._write()

    def ack(self, queue: str, gid: str, idxs: list[int]) -> Any:
        return self._write()

    def refuse_all(self) -> int:
        """Fail the pending writes as a backend does (undo first), then run what they wake."""
        writes, self.writes = self.writes, []
        for fut in writes:
            fut.finish(StorageError("queue storage write failed: database or disk is full"))
            fut.exception()  # retrieved: the caller would answer 507
        self.loop.run_until_complete(asyncio.sleep(0))
        return len(writes)


def snapshot(q: Queue) -> tuple[Any, ...]:
    """Everything a refused removal must leave as it was."""
    groups = {
        gid: (dict(g.pending), set(g.committed), dict(g.deliveries), dict(g.tags), sorted(g.returned))
        for gid, g in q.groups.items()
    }
    consumers = {
        (gid, uid): (sorted(c.pending), c.releasing)
        for gid, g in q.groups.items()
        for uid, c in g.consumers.items()
    }
    records = {idx: (r.rid, r.data, dict(r.tags), r.fetched) for idx, r in q.records.items()}
    memory = (dict(q.recent), dict(q.recent_rids), dict(q.by_rid), q.bytes, q.cached_bytes)
    return records, groups, consumers, memory


class RefusingMachine(QueueMachine):
    @initialize()
    def setup(self) -> None:
        super().setup()
        self.loop = asyncio.new_event_loop()
        self.backend = RefusingBackend(self.loop)
        self.q = Queue("q", QueueConfig(max_length=50, max_window=8), self.backend, grace_s=0)

    def _refused(self, call: Any) -> int:
        """Run ``call`` with the writes refused; the queue must be as it was before.
        -> how many writes were refused."""
        before = snapshot(self.q)
        self.backend.refusing = True
        try:
            call()
        except QueueError:
            assert not self.backend.writes, "refused with a 4xx after writing"
        finally:
            self.backend.refusing = False
        refused = self.backend.refuse_all()
        assert snapshot(self.q) == before
        return refused

    @rule(data=st.binary(max_size=8), tag=st.sampled_from(["a", "b"]))
    def refused_put(self, data: bytes, tag: str) -> None:
        if self._refused(lambda: self.q.put(data, {"t": tag}, None)):
            self.next_idx += 1  # the refused put's index is never used again

    @rule(c=st.sampled_from(COMMITTERS), data=st.data())
    def refused_commit(self, c: tuple[str, str], data: st.DataObject) -> None:
        g = self.groups.get(c[0])
        seen = (set(g.outstanding) | g.delivered) if g else set()
        candidates = [*sorted(seen | self.fetched | set(self.live)), self.next_idx + 3]
        idxs = data.draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=4))
        self._refused(lambda: self.q.commit(c[0], idxs))

    @rule(data=st.data())
    def refused_delete(self, data: st.DataObject) -> None:
        pool = [*sorted(self.live), self.next_idx + 1]
        idxs = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))
        self._refused(lambda: self.q.delete(idxs))

    @rule(below=st.integers(1, 60))
    def refused_truncate(self, below: int) -> None:
        self._refused(lambda: self.q.truncate(below))

    @rule(index=st.integers(0, 60), length=st.integers(1, 5))
    def refused_get(self, index: int, length: int) -> None:
        self._refused(lambda: self.q.get(index, length, True, None, {}))

    def teardown(self) -> None:
        super().teardown()
        if hasattr(self, "loop"):
            self.loop.close()


# More runs than the base machine: the failures this finds need several groups and steps.
RefusingMachine.TestCase.settings = settings(QueueMachine.TestCase.settings, max_examples=500)
TestQueueModelWithRefusals = RefusingMachine.TestCase


# ------------------------------------------------------------------ cases it found


def _queue() -> tuple[Queue, RefusingBackend]:
    backend = RefusingBackend(asyncio.new_event_loop())
    return Queue("q", QueueConfig(max_length=50, max_window=8), backend, grace_s=0), backend


def _refuse(backend: RefusingBackend, call: Any) -> None:
    backend.refusing = True
    try:
        call()
    finally:
        backend.refusing = False
    assert backend.refuse_all() > 0


def test_records_put_back_keep_their_index_order() -> None:
    q, backend = _queue()
    for _ in range(5):
        q.put(b"r", {}, None)
    _refuse(backend, lambda: q.delete([1]))
    q.delete([2, 3, 4])  # few records over a long range: a get walks the records themselves
    assert [r.idx for r in q.get(0, 1, False, None, {})[0]] == [1]  # not 5, put back before 1
    backend.loop.close()


def test_a_returned_record_put_back_is_handed_out_once() -> None:
    """A record a consumer gave back waits in its group; a refused removal of it, or a
    refused commit of it by a group while another group still needs it, leaves it there once."""
    q, backend = _queue()
    q.put(b"r", {}, None)
    q.put(b"r", {}, None)
    c, _ = q.connect("g1", "u1", 0, 2, False, {})
    q.connect("g2", "u2", 0, 2, False, {})  # also owed record 2: g1's commit is an ack
    assert [r.idx for r, _ in q.take(c)[0]] == [1, 2]
    c, _ = q.connect("g1", "u1", 0, 1, False, {})  # a smaller window: 2 goes back to the group
    _refuse(backend, lambda: q.delete([2]))
    _refuse(backend, lambda: q.commit("g1", [2]))
    q.commit("g1", [1])
    c, _ = q.connect("g1", "u1", 0, 2, False, {})
    assert [(r.idx, n) for r, n in q.take(c)[0]] == [(2, 2)]  # once, its second delivery
    backend.loop.close()


def test_an_auto_commit_consumer_gets_back_what_it_held() -> None:
    """A consumer that reconnects with auto_commit keeps (and is resent) what it held; a
    refused removal puts those records back with it, not with the group."""
    q, backend = _queue()
    q.put(b"r", {}, None)
    c, _ = q.connect("g1", "u1", 0, 1, False, {})
    assert [r.idx for r, _ in q.take(c)[0]] == [1]
    c, _ = q.connect("g1", "u1", 0, 1, True, {})
    _refuse(backend, lambda: q.delete([1]))
    assert (list(c.pending), q.groups["g1"].pending, q.groups["g1"].returned) == ([1], {1: "u1"}, [])
    backend.loop.close()


def test_room_a_commit_frees_is_not_taken_while_its_write_is_in_flight() -> None:
    """Anything may let a watcher take more while a commit is being written (a put made
    visible wakes every watcher): the room the commit frees counts only once it is
    durable, so a refused commit never leaves a window holding more than it may."""
    q, backend = _queue()
    for _ in range(4):
        q.put(b"r", {}, None)
    c, _ = q.connect("g1", "u1", 0, 2, False, {})
    assert [r.idx for r, _ in q.take(c)[0]] == [1, 2]
    backend.refusing = True
    q.commit("g1", [1, 2])
    backend.refusing = False
    assert q.take(c)[0] == []  # the commit is not durable yet
    backend.refuse_all()
    assert sorted(c.pending) == [1, 2]
    q.commit("g1", [1, 2])  # accepted at once: the room is there
    assert [r.idx for r, _ in q.take(c)[0]] == [3, 4]
    backend.loop.close()
