"""A caller that stops waiting (its client hung up, its handler was cancelled) never cancels
a write: the change it asked for completes, or is undone in memory when the store refuses
it, whoever still waits for the answer; a caller sharing the write of a put with the same
request id is answered as if it were alone. On both backends (the end to end run over real
connections: tests/e2e/queue/test_disconnects.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from gateway.queue.backend import StorageError
from gateway.queue.durable import Durable, Write
from gateway.queue.records import Consumer
from gateway.queue.store import Queue
from tests.gateway.queue.test_backend_conformance import Store


async def _wait(dur: Durable) -> None:
    assert dur is not None
    await dur


class Caller:
    """A caller that makes a change and waits for its write (as a request handler does)."""

    def __init__(self, change: Callable[[], Durable]) -> None:
        self.write: Durable = None
        self.task = asyncio.ensure_future(self._call(change))

    async def _call(self, change: Callable[[], Durable]) -> None:
        self.write = change()
        await _wait(self.write)


async def _leaving(*changes: Callable[[], Durable]) -> list[Caller]:
    """Callers that make their changes in one turn of the loop, before any write completes."""
    callers = [Caller(change) for change in changes]
    await asyncio.sleep(0)  # each caller has made its change and waits for its write now
    assert all(c.write is not None and not c.task.done() for c in callers)
    return callers


async def _left(change: Callable[[], Durable]) -> Durable:
    """Make ``change`` in a caller that is cancelled while it waits -> its write."""
    [caller] = await _leaving(change)
    caller.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller.task  # cancelled once the write has completed, not before
    assert isinstance(caller.write, Write) and caller.write.done() and not caller.write.cancelled()
    return caller.write


def _rows(q: Queue) -> list[tuple[int, str]]:
    return [(r.idx, r.rid) for r in q.records.values()]


async def test_a_put_whose_caller_left_is_stored_once(store: Store) -> None:
    m = store.manager()
    await m.start()
    q = m.queue("a")
    dur = await _left(lambda: q.put(b"x", {}, "rid-1")[2])
    assert isinstance(dur, Write) and dur.exception() is None
    [(idx, rid)] = _rows(q)  # in memory, as on disk
    assert rid == "rid-1"
    again, _rid, more = q.put(b"x", {}, "rid-1")  # the client retries: nothing new is stored
    assert (again, more) == (idx, None)
    await m.stop()
    m2 = store.manager()
    await m2.start()
    assert _rows(m2.queue("a")) == [(idx, "rid-1")]
    await m2.stop()


@pytest.mark.parametrize("leaving", [0, 1], ids=["first-leaves", "second-leaves"])
async def test_callers_of_one_request_id_in_flight_are_answered_whoever_leaves(
    store: Store, leaving: int
) -> None:
    m = store.manager()
    await m.start()
    q = m.queue("a")
    answers: list[int] = []

    def put() -> Durable:
        idx, _rid, dur = q.put(b"x", {}, "rid-1")  # the second finds the first in flight
        answers.append(idx)
        return dur

    callers = await _leaving(put, put)
    assert callers[0].write is callers[1].write and answers[0] == answers[1]
    callers[leaving].task.cancel()
    assert await callers[1 - leaving].task is None  # answered: the other's leaving ended nothing
    with pytest.raises(asyncio.CancelledError):
        await callers[leaving].task
    assert _rows(q) == [(answers[0], "rid-1")]
    await m.stop()


async def test_a_refused_write_is_undone_when_its_caller_has_left(store: Store) -> None:
    """Nobody waits for the 507 any more; the memory must still match the store."""
    m = store.manager()
    await m.start()
    q = m.queue("a")
    for i in range(3):
        await _wait(q.put(f"r{i}".encode(), {}, None)[2])
    c, dur = q.connect("g", "u", 0, 3, False, {})
    if dur is not None:
        await dur
    assert [r.idx for r, _n in q.take(c)[0]] == [1, 2, 3]
    store.break_writes(m)
    try:
        changes: list[Callable[[], Durable]] = [
            lambda: q.commit("g", [1]),
            lambda: q.delete([2]),
            lambda: q.put(b"new", {}, "rid-new")[2],
        ]
        for change in changes:
            dur = await _left(change)
            assert isinstance(dur, Write) and isinstance(dur.exception(), StorageError)
    finally:
        store.mend_writes(m)
    await asyncio.sleep(0)  # the refused put's own callback (it is never visible) has run
    assert [i for i, _ in _rows(q)] == [1, 2, 3]  # the refused commit and delete undone
    assert sorted(c.pending) == [1, 2, 3] and q.groups["g"].pending == {1: "u", 2: "u", 3: "u"}
    assert "rid-new" not in q.by_rid and q.inflight == 0
    await _wait(q.commit("g", [1, 2, 3]))  # the same calls, once the store takes writes again
    assert q.length == 0
    await m.stop()
    m2 = store.manager()
    await m2.start()
    assert _rows(m2.queue("a")) == []
    await m2.stop()


async def test_a_refused_watch_is_undone_when_its_caller_has_left(store: Store) -> None:
    """A watcher that left while its new group was being written: the group is not kept
    in memory when the store refused it, and its consumer is gone."""
    m = store.manager()
    await m.start()
    q = m.queue("a")
    consumers: list[Consumer] = []

    def watch() -> Durable:
        c, dur = q.connect("g", "u", 0, 3, False, {})
        consumers.append(c)
        return dur

    store.break_writes(m)
    try:
        dur = await _left(watch)
        assert isinstance(dur, Write) and isinstance(dur.exception(), StorageError)
    finally:
        store.mend_writes(m)
    assert "g" not in q.groups and not consumers[0].connected
    await m.stop()
    m2 = store.manager()
    await m2.start()
    assert "g" not in m2.queue("a").groups
    await m2.stop()
