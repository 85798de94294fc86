"""One conformance suite for every queue backend: the embedded SQLite store and Redis.

Each test runs once per backend (the ``store`` fixture) and checks what the queue promises
across a clean restart and a crash: records, indexes (never reused), group state and
filters, the memory of removed records, and a refused write answered 507 without losing
anything acknowledged. The semantics between restarts are the backend-independent state
machine's (test_store_model.py).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from eas_sdk.errors import HTTPStatusError
from eas_sdk.queue import AsyncQueueClient
from gateway.config import parse_config
from gateway.queue.backend import StorageError
from gateway.queue.datadir import LockedSqliteBackend
from gateway.queue.groups_admin import delete_group
from gateway.queue.manager import QueueManager
from gateway.queue.redis_backend import RedisBackend
from gateway.queue.server import MANAGER_KEY, build_app
from gateway.queue.sqlite import SqliteBackend
from gateway.queue.store import Queue, QueueError
from tests.e2e.queue.server_proc import TOKEN, queue_config
from tests.redis_server import RedisServer

REDIS_DB = 1  # flushed before each test of this module
LEASE_S = 0.3


class Store:
    """How to make a manager over one backend, crash it, and make its writes fail."""

    def __init__(self, kind: str, tmp_path: Path, redis: RedisServer | None) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.redis = redis

    def config(self, names: list[str], **queue: Any) -> dict[str, Any]:
        if self.redis is not None:
            queue["backend"] = self.redis.url(REDIS_DB)
            queue["owner_lease_s"] = LEASE_S
        return queue_config(self.tmp_path / "data", names, **queue)

    def manager(self, fsync: str = "normal") -> QueueManager:
        return QueueManager(parse_config(self.config(["a", "b"], fsync=fsync)))

    async def crash(self, m: QueueManager) -> None:
        """Stop writing without a clean stop, as a kill -9 would (what is acknowledged stays)."""
        b = m.backend
        if isinstance(b, SqliteBackend):
            b._ckpt_stop.set()
            b._conn.close()
            if isinstance(b, LockedSqliteBackend) and b.lock is not None:
                b.lock.release()  # the kernel drops a killed process's flock
        else:
            await self.crash_redis(m)

    @staticmethod
    async def crash_redis(m: QueueManager) -> None:
        b = m.backend
        assert isinstance(b, RedisBackend)
        for lease in m.leases.values():  # never given back: the next one waits for it to expire
            await lease.pause()
            await lease.client.aclose()
        await b.client.aclose()  # no final write of the next indexes
        await asyncio.sleep(LEASE_S * 1.2)

    def break_writes(self, m: QueueManager) -> None:
        """Every write now fails (a read-only disk; a Redis refusing writes)."""
        b = m.backend
        if isinstance(b, SqliteBackend):
            b._conn.execute("PRAGMA query_only=1")
        else:
            assert self.redis is not None
            with self.redis.client() as c:
                c.config_set("min-replicas-to-write", 1)  # no replica: writes answer NOREPLICAS

    def mend_writes(self, m: QueueManager) -> None:
        b = m.backend
        if isinstance(b, SqliteBackend):
            b._conn.execute("PRAGMA query_only=0")
        else:
            assert self.redis is not None
            with self.redis.client() as c:
                c.config_set("min-replicas-to-write", 0)


async def _filled(store: Store, n: int) -> tuple[QueueManager, Queue]:
    """A started manager whose queue ``a`` holds ``n`` records."""
    m = store.manager()
    await m.start()
    q = m.queue("a")
    for i in range(n):
        await q.put(f"r{i}".encode(), {}, None)[2]
    return m, q


async def test_backend_is_the_configured_one(store: Store) -> None:
    m = store.manager()
    assert m.backend.name == store.kind  # type: ignore[attr-defined]
    await m.start()
    assert m.queue("a").attributes({"user": "u", "group": "g", "priority": "p"}, "?")
    assert m.snapshot()["backends"] == [store.kind]
    await m.stop()


async def test_restart_keeps_records_indexes_and_group_state(store: Store) -> None:
    m = store.manager()
    await m.start()
    q = m.queue("a")
    for i in range(5):
        _idx, _rid, dur = q.put(f"r{i}".encode(), {"k": str(i)}, None)
        await dur
    # Two groups: g1 commits 1 and 2, g2 commits 1 -> 1 is gone, 2 waits for g2.
    c1, _ = q.connect("g1", "u1", 0, 5, False, {})
    c2, _ = q.connect("g2", "u2", 0, 5, False, {})
    q.take(c1)
    q.take(c2)
    await q.commit("g1", [1, 2])
    await q.commit("g2", [1])
    await q.delete([5])  # the highest index is gone: it must never be reused
    await m.stop()
    assert sorted(q.records) == [2, 3, 4]

    m2 = store.manager()
    await m2.start()
    q2 = m2.queue("a")
    assert sorted(q2.records) == [2, 3, 4]
    assert q2.records[3].tags == {"k": "2", "requestId": q.records[3].rid}
    assert q2.payload(q2.records[3]) == b"r2"
    assert q2.groups["g1"].committed == {2} and not q2.groups["g2"].committed
    idx, _rid, dur = q2.put(b"new", {}, None)
    await dur
    assert idx == 6
    # After the restart g1 is owed 3 and 4 (2 it committed); g2 is owed 2, 3, 4.
    c1, _ = q2.connect("g1", "u1", 0, 10, False, {})
    assert [r.idx for r, _ in q2.take(c1)[0]] == [3, 4, 6]
    c2, _ = q2.connect("g2", "u9", 0, 10, False, {})
    assert [r.idx for r, _ in q2.take(c2)[0]] == [2, 3, 4, 6]
    # Committed by both groups now: gone for good, also after another restart.
    await q2.commit("g2", [2])
    await m2.stop()
    m3 = store.manager()
    await m3.start()
    assert sorted(m3.queue("a").records) == [3, 4, 6]
    assert m3.queue("a").groups["g1"].committed == set()
    await m3.stop()


async def test_crash_keeps_indexes_above_every_used_one(store: Store) -> None:
    """Without a clean stop (no final write) indexes still continue above every used one."""
    m = store.manager()
    await m.start()
    q = m.queue("b")
    for _ in range(3):
        await q.put(b"x", {}, None)[2]
    await q.delete([3])
    await store.crash(m)
    m2 = store.manager()
    await m2.start()
    idx, _, dur = m2.queue("b").put(b"y", {}, None)
    await dur
    assert idx > 3
    assert sorted(m2.queue("b").records) == [1, 2, idx]
    await m2.stop()


async def test_removed_records_are_remembered_across_a_crash(store: Store) -> None:
    """A commit repeated after a restart is OK and a put retried with the request id of a
    consumed record returns its index without storing it again."""
    m = store.manager()
    await m.start()
    q = m.queue("a")
    for i in range(4):
        await q.put(f"r{i}".encode(), {}, f"rid-{i}")[2]
    c, _ = q.connect("g", "u", 0, 5, False, {})
    q.take(c)
    await q.commit("g", [1])  # committed
    _recs, dur = q.get(2, 1, True, None, {})  # consumed by a get
    await dur
    await q.delete([3])  # deleted
    await store.crash(m)

    m2 = store.manager()
    await m2.start()
    q2 = m2.queue("a")
    assert sorted(q2.records) == [4]
    assert q2.commit("g", [1]) is None  # OK, nothing to do
    assert q2.commit("g", [2, 3]) is None
    for i, rid in enumerate(["rid-0", "rid-1", "rid-2"]):
        idx, _rid, dur = q2.put(b"again", {}, rid)
        assert (idx, dur) == (i + 1, None)
    assert sorted(q2.records) == [4]
    with pytest.raises(QueueError) as info:
        q2.commit("g", [99])  # never put
    assert info.value.status == 404
    await m2.stop()


async def test_removed_record_memory_is_bounded(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.queue.recordlog as recordlog_mod
    import gateway.queue.redis_backend as redis_mod
    import gateway.queue.sqlite as sqlite_mod

    monkeypatch.setattr(sqlite_mod, "RECENT_LIMIT", 10)
    monkeypatch.setattr(sqlite_mod, "PRUNE_EVERY", 8)
    monkeypatch.setattr(redis_mod, "RECENT_LIMIT", 10)
    monkeypatch.setattr(redis_mod, "PRUNE_SLACK", 8)
    monkeypatch.setattr(recordlog_mod, "RECENT_LIMIT", 10)
    m = store.manager()
    await m.start()
    q = m.queue("a")
    for i in range(40):
        await q.put(b"x", {}, f"r{i}")[2]
        await q.delete([i + 1])
    assert len(q.recent) == 10 and next(iter(q.recent)) == 31
    await m.stop()
    if store.redis is not None:  # the store keeps what it must and a bounded slack, no more
        with store.redis.client(REDIS_DB) as c:
            kept = [json.loads(f[b"p"])[0][0] for _id, f in c.xrange("easq:a:removed")]
        assert len(kept) <= 10 + 8 and min(kept) >= 40 - 10 - 8 + 1 and kept[-1] == 40
    m2 = store.manager()
    await m2.start()
    assert list(m2.queue("a").recent) == list(range(31, 41))
    await m2.stop()


async def test_group_filter_change_is_kept(store: Store) -> None:
    m = store.manager()
    await m.start()
    q = m.queue("a")
    for color in ("red", "blue", "red"):
        await q.put(color.encode(), {"color": color}, None)[2]
    c, dur = q.connect("g", "u", 0, 5, True, {"color": "red"})
    await dur
    out, dur = q.take(c)
    await dur
    assert [r.idx for r, _ in out] == [1, 3]
    q.disconnect(c)
    # Another filter while nobody is connected: the blue record the red filter skipped comes.
    c, dur = q.connect("g", "u", 0, 5, False, {"color": "blue"})
    await dur
    assert [r.idx for r, _ in q.take(c)[0]] == [2]
    await store.crash(m)
    m2 = store.manager()
    await m2.start()
    q2 = m2.queue("a")
    assert q2.groups["g"].tags == {"color": "blue"}
    assert sorted(q2.records) == [2]  # delivered, not committed: delivered again after the crash
    await m2.stop()


async def test_failing_storage_answers_507_and_recovers(store: Store) -> None:
    cfg = parse_config(store.config(["a"]))
    app = build_app(cfg)
    async with TestServer(app, host="127.0.0.1") as server:
        m = app[MANAGER_KEY]
        async with AsyncQueueClient(f"127.0.0.1:{server.port}", "a") as client:
            client.set_token(TOKEN)
            client.set_retry_count(0)
            client.init()
            await client.put(b"before")
            store.break_writes(m)
            try:
                with pytest.raises(HTTPStatusError) as info:
                    await client.put(b"refused")
                assert info.value.code == 507
            finally:
                store.mend_writes(m)
            index, _ = await client.put(b"after")
            got = await client.get(length=10, auto_delete=False, timeout="0s")
            assert [d.data for d in got] == [b"before", b"after"]
            assert int(index) == 3  # the refused put's index is not reused


async def test_a_deleted_group_stays_deleted(store: Store) -> None:
    """Deleting a group is journalled: after a crash it is gone with what it committed, and
    the records it alone still needed stay deleted."""
    m, q = await _filled(store, 4)
    keep, _ = q.connect("keep", "u1", 0, 5, False, {})
    gone, _ = q.connect("gone", "u2", 0, 5, False, {})
    q.take(gone)
    await q.commit("gone", [1, 2])  # kept for group keep: journalled as acks of group gone
    q.take(keep)
    await q.commit("keep", [3])  # kept for group gone
    q.disconnect(gone)
    n, dur = delete_group(q, "gone")
    await dur
    assert n == 1 and sorted(q.records) == [1, 2, 4]  # 3: only group gone still needed it
    await store.crash(m)

    m2 = store.manager()
    await m2.start()
    q2 = m2.queue("a")
    assert sorted(q2.groups) == ["keep"] and sorted(q2.records) == [1, 2, 4]
    assert q2.commit("gone", [3]) is None  # a removed record: idempotent
    c, _ = q2.connect("gone", "u2", 0, 5, False, {})  # a new group of that name starts afresh
    assert [r.idx for r, _ in q2.take(c)[0]] == [1, 2, 4]
    await m2.stop()


async def test_a_refused_removal_changes_nothing_in_memory_or_on_disk(store: Store) -> None:
    """Delete, truncate, a get with auto-delete, a commit and a group's deletion whose write
    is refused leave the queue as it was (in memory now, on disk after a restart)."""
    m = store.manager()
    await m.start()
    q = m.queue("a")
    for i in range(6):
        await q.put(f"r{i}".encode(), {}, f"rid-{i}")[2]
    c, dur = q.connect("g1", "u1", 0, 2, False, {})
    await dur
    assert [r.idx for r, _ in q.take(c)[0]] == [1, 2]
    figures = (q.bytes, q.cached_bytes)  # what the byte cap and the payload cache count
    idle, dur = q.connect("g2", "u2", 0, 2, False, {})
    await dur
    q.disconnect(idle)
    store.break_writes(m)
    try:
        refused = [
            lambda: q.delete([3]),
            lambda: q.truncate(5)[1],
            lambda: q.get(0, 2, True, None, {})[1],
            lambda: q.commit("g1", [1]),
            lambda: delete_group(q, "g2")[1],
        ]
        for call in refused:
            with pytest.raises(StorageError):
                await call()
            assert sorted(q.records) == [1, 2, 3, 4, 5, 6]
            assert (q.bytes, q.cached_bytes) == figures
        assert sorted(q.groups) == ["g1", "g2"]
        g1 = q.groups["g1"]
        assert (dict(g1.pending), sorted(c.pending), g1.committed) == ({1: "u1", 2: "u1"}, [1, 2], set())
        assert q.by_rid["rid-0"] == 1 and "rid-0" not in q.recent_rids
        assert m.storage_failure() is not None
    finally:
        store.mend_writes(m)
    await q.commit("g1", [2])  # a write that succeeds: the store is healthy again
    assert m.storage_failure() is None
    await store.crash(m)

    m2 = store.manager()
    await m2.start()
    q2 = m2.queue("a")
    assert sorted(q2.records) == [1, 2, 3, 4, 5, 6]  # 2: still owed to g2
    assert sorted(q2.groups) == ["g1", "g2"]
    await m2.stop()


async def test_room_a_commit_frees_is_offered_once_the_commit_is_durable(store: Store) -> None:
    """A watcher woken by a commit takes more only after the commit's write: a refused one
    puts the records back in its window, which must not have been handed out meanwhile, and
    the client's answer goes out before the hand-out it allows."""
    m, q = await _filled(store, 4)
    c, dur = q.connect("g1", "u1", 0, 2, False, {})
    await dur
    assert [r.idx for r, _ in q.take(c)[0]] == [1, 2]
    handed: list[list[int]] = []

    def writer() -> None:  # what a watch's writer does when woken: take what the window allows
        handed.append([r.idx for r, _ in q.take(c)[0]])

    c.wake = lambda: asyncio.get_running_loop().call_soon(writer)
    store.break_writes(m)
    try:
        with pytest.raises(StorageError):
            await q.commit("g1", [1, 2])
        await asyncio.sleep(0.05)
        assert (sorted(c.pending), [i for h in handed for i in h]) == ([1, 2], [])
    finally:
        store.mend_writes(m)
    dur = q.commit("g1", [1, 2])
    assert isinstance(dur, asyncio.Future)
    when_answered: list[list[list[int]]] = []
    dur.add_done_callback(lambda _: when_answered.append(list(handed)))
    await dur
    await asyncio.sleep(0.05)
    assert (when_answered, handed[-1], sorted(c.pending)) == ([[]], [3, 4], [3, 4])
    await m.stop()


async def test_a_watch_whose_group_cannot_be_written_is_refused_and_leaves_no_group(store: Store) -> None:
    cfg = parse_config(store.config(["a"]))
    app = build_app(cfg)
    async with TestServer(app, host="127.0.0.1") as server:
        m = app[MANAGER_KEY]
        url = f"http://127.0.0.1:{server.port}/api/predict/a?_watch_=true&_index_=0&_window_=1"
        headers = {"Authorization": TOKEN, "X-EAS-QueueService-Redis-Gid": "new"}
        store.break_writes(m)
        try:
            async with aiohttp.ClientSession() as session:
                with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                    await session.ws_connect(url, headers=headers)
            assert info.value.status == 507
            assert m.queue("a").groups == {}
        finally:
            store.mend_writes(m)


async def test_a_batch_put_is_one_write_that_a_crash_keeps(store: Store) -> None:
    """``put_many``: one journal write for the batch, each item answered as a put would be
    (a known request id stores nothing, a refusal refuses that item only); what it wrote
    survives a crash, and a batch retried after it stores nothing twice."""
    m = store.manager()
    await m.start()
    q = m.queue("a")
    await q.put(b"old", {}, "rid-old")[2]
    ops = m.backend.ops  # type: ignore[attr-defined]
    answers, dur = q.put_many(
        [
            (b"n1", {"k": "1"}, "rid-1"),
            (b"n2", {}, None),
            (b"dup", {}, "rid-old"),  # in the queue already
            (b"again", {}, "rid-1"),  # twice in the batch
            (b"x" * (q.cfg.max_payload_bytes + 1), {}, "rid-big"),
        ]
    )
    assert [a if isinstance(a, tuple) else a.status for a in answers[:4]] == [
        (2, "rid-1"),
        (3, answers[1][1]),  # type: ignore[index]
        (1, "rid-old"),
        (2, "rid-1"),
    ]
    assert isinstance(answers[4], QueueError) and answers[4].status == 413
    assert dur is not None and 2 not in q.records  # visible once durable
    await dur
    assert sorted(q.records) == [1, 2, 3] and q.inflight == 0
    assert m.backend.ops == ops + 1  # type: ignore[attr-defined]
    assert q.records[2].tags == {"k": "1", "requestId": "rid-1"}
    await store.crash(m)

    m2 = store.manager()
    await m2.start()
    q2 = m2.queue("a")
    assert [q2.payload(q2.records[i]) for i in (1, 2, 3)] == [b"old", b"n1", b"n2"]
    c, _ = q2.connect("g", "u", 0, 10, False, {})
    q2.take(c)
    await q2.commit("g", [2])  # consumed: its request id is remembered
    answers, dur = q2.put_many([(b"n1", {}, "rid-1"), (b"n3", {}, "rid-3")])
    (i1, r1), (i3, r3) = answers  # type: ignore[misc]
    assert (i1, r1, r3) == (2, "rid-1", "rid-3") and i3 > 3  # (after a crash: above the reservation)
    await dur
    assert sorted(q2.records) == [1, 3, i3]
    await m2.stop()


async def test_a_refused_batch_put_leaves_nothing_and_can_be_retried(store: Store) -> None:
    m = store.manager()
    await m.start()
    q = m.queue("a")
    figures = (q.bytes, q.length)
    store.break_writes(m)
    try:
        answers, dur = q.put_many([(b"r1", {}, "rid-1"), (b"r2", {}, "rid-2")])
        assert answers == [(1, "rid-1"), (2, "rid-2")]
        with pytest.raises(StorageError):
            await dur  # type: ignore[misc]
    finally:
        store.mend_writes(m)
    assert (q.bytes, q.length, q.inflight, q.inflight_rids) == (*figures, 0, {})
    answers, dur = q.put_many([(b"r1", {}, "rid-1"), (b"r2", {}, "rid-2")])
    assert answers == [(3, "rid-1"), (4, "rid-2")]  # the refused indexes are not reused
    await dur
    await m.stop()
    m2 = store.manager()
    await m2.start()
    assert [(r.idx, r.rid) for r in m2.queue("a").records.values()] == [(3, "rid-1"), (4, "rid-2")]
    await m2.stop()
