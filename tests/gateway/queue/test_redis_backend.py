"""The Redis backend's own promises: its key layout, the persistence it needs for
``fsync``, and acknowledged records surviving a kill -9 of the Redis server itself."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import redis

from gateway.config import parse_config
from gateway.queue.backend import StorageError
from gateway.queue.manager import QueueManager
from gateway.queue.records import Record
from gateway.queue.redis_backend import RedisBackend, _seq, redacted
from gateway.queue.store import Queue
from tests.e2e.queue.server_proc import queue_config
from tests.gateway.queue.test_backend_conformance import LEASE_S, Store
from tests.redis_server import RedisServer


def _manager(tmp_path: Path, url: str, fsync: str = "normal", lease_s: float = LEASE_S) -> QueueManager:
    cfg = queue_config(tmp_path / "data", ["a"], backend=url, fsync=fsync, owner_lease_s=lease_s)
    return QueueManager(parse_config(cfg))


async def _filled(tmp_path: Path, url: str, n: int) -> tuple[QueueManager, Queue]:
    """A started manager whose queue ``a`` holds ``n`` records."""
    m = _manager(tmp_path, url)
    await m.start()
    q = m.queue("a")
    for i in range(n):
        await q.put(f"r{i}".encode(), {}, None)[2]
    return m, q


async def test_key_layout(tmp_path: Path, redis_server: RedisServer) -> None:
    with redis_server.client(2) as c:
        c.flushdb()
    m = _manager(tmp_path, redis_server.url(2))
    await m.start()
    q = m.queue("a")
    await q.put(b"one", {"k": "v"}, "rid-1")[2]
    await q.put(b"two", {}, "rid-2")[2]
    c1, _ = q.connect("g", "u", 0, 5, False, {"k": "v"})
    assert [r.idx for r, _ in q.take(c1)[0]] == [1]
    await q.commit("g", [1])
    await m.stop()
    with redis_server.client(2) as c:
        [(entry_id, fields)] = c.xrange("easq:a:records")
        assert entry_id == b"2-0"
        assert fields == {b"r": b"rid-2", b"t": b'{"requestId": "rid-2"}', b"d": b"two"}
        [(_id, stone)] = c.xrange("easq:a:removed")
        assert stone == {b"n": b"1", b"p": b'[[1, "rid-1"]]'}
        assert json.loads(c.hget("easq:a:groups", "g")) == [1, {"k": "v"}]
        assert c.get("easq:a:next") == b"3"


async def test_records_taken_from_the_front_go_in_one_trim(tmp_path: Path, redis_server: RedisServer) -> None:
    """A removal with nothing kept below it trims the stream (one command, whatever it
    removes); one that leaves a record below deletes entry by entry and keeps that record."""
    with redis_server.client(2) as c:
        c.flushdb()
        c.config_resetstat()
    m, q = await _filled(tmp_path, redis_server.url(2), 6)
    c1, _ = q.connect("g", "u", 0, 6, False, {})
    assert [r.idx for r, _ in q.take(c1)[0]] == [1, 2, 3, 4, 5, 6]
    with redis_server.client(2) as c:

        def stream_and_calls() -> tuple[list[bytes], dict[str, int]]:
            stats = c.info("commandstats")
            calls = {k: stats.get(f"cmdstat_{k}", {}).get("calls", 0) for k in ("xdel", "xtrim")}
            return [entry_id for entry_id, _ in c.xrange("easq:a:records")], calls

        await q.commit("g", [2, 3])  # 1 is still held
        assert stream_and_calls() == ([b"1-0", b"4-0", b"5-0", b"6-0"], {"xdel": 1, "xtrim": 0})
        await q.commit("g", [1])  # nothing below 4 is kept now: 1 goes with a trim
        assert stream_and_calls() == ([b"4-0", b"5-0", b"6-0"], {"xdel": 1, "xtrim": 1})
        await q.commit("g", [4, 5, 6])
        assert stream_and_calls() == ([], {"xdel": 1, "xtrim": 2})
    await m.stop()
    m2 = _manager(tmp_path, redis_server.url(2))
    await m2.start()
    q2 = m2.queue("a")
    assert (q2.length, sorted(q2.recent)) == (0, [1, 2, 3, 4, 5, 6])
    await m2.stop()


async def test_fsync_always_needs_a_redis_that_fsyncs_every_write(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    m = _manager(tmp_path, redis_server.url(2), fsync="always")  # the session server: everysec
    with pytest.raises(StorageError, match="appendfsync always"):
        await m.start()
    await m.backend.aclose()  # type: ignore[attr-defined]
    with RedisServer(tmp_path / "fsync-always", appendfsync="always").start() as strict:
        m2 = _manager(tmp_path, strict.url(0), fsync="always")
        await m2.start()
        await m2.queue("a").put(b"x", {}, None)[2]
        await m2.stop()


async def test_acknowledged_put_survives_a_kill_of_redis(tmp_path: Path) -> None:
    """appendonly yes + appendfsync everysec: Redis wrote the put to its append-only file
    before it answered, so a SIGKILL of the server right after loses nothing acknowledged."""
    with RedisServer(tmp_path / "redis") as server:
        server.start()
        m, q = await _filled(tmp_path, server.url(0), 50)
        await q.delete([1])  # a removal is acknowledged the same way
        server.kill()
        await Store.crash_redis(m)
        server.start()
        m2 = _manager(tmp_path, server.url(0))
        await m2.start()
        q2 = m2.queue("a")
        assert [r.data for r in q2.records.values()] == [f"r{i}".encode() for i in range(1, 50)]
        assert 1 in q2.recent
        await m2.stop()


async def test_a_gateway_that_lost_the_lease_cannot_write(tmp_path: Path, redis_server: RedisServer) -> None:
    """Fencing: a paused owner whose lease expired and was taken over gets its late writes
    refused, so they never mix with its successor's."""
    with redis_server.client(2) as c:
        c.flushdb()
    m1 = _manager(tmp_path, redis_server.url(2))
    await m1.start()
    q1 = m1.queue("a")
    await q1.put(b"before", {}, None)[2]
    [lease1] = m1.leases.values()
    await lease1.pause()  # "paused": no renewals
    await asyncio.sleep(LEASE_S * 1.2)
    m2 = _manager(tmp_path, redis_server.url(2))
    await m2.start()  # the lease expired: this one serves the queue now
    assert "a" in m2.queues and m2.queue("a").length == 1
    with pytest.raises(StorageError, match="no longer serves"):
        await q1.put(b"late", {}, None)[2]
    await m2.queue("a").put(b"after", {}, None)[2]
    await m2.stop()
    await m1.stop()  # its release checks the token: the successor keeps the lease
    with redis_server.client(2) as c:
        assert [f[b"d"] for _id, f in c.xrange("easq:a:records")] == [b"before", b"after"]


def test_logs_and_errors_never_name_the_password() -> None:
    assert redacted("redis://:s3cret@10.0.0.5:6379/0") == "redis://***@10.0.0.5:6379/0"
    assert redacted("rediss://user:s3cret@cache.internal/2") == "rediss://***@cache.internal/2"
    assert redacted("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    b = RedisBackend("redis://:s3cret@127.0.0.1:1/0")
    assert "s3cret" not in b.where


async def test_a_restarted_gateway_at_the_same_address_serves_at_once(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """A lease published with the address this gateway now listens on belongs to a dead
    previous run of it: taken over without waiting for it to expire."""
    with redis_server.client(2) as c:
        c.flushdb()
    url = redis_server.url(2)
    cfg = queue_config(tmp_path / "data", ["a"], backend=url, owner_lease_s=30.0)
    m1 = QueueManager(parse_config(cfg))
    await m1.start()
    m1.advertise("127.0.0.1", 5555)
    [lease1] = m1.leases.values()
    await lease1.claim()  # publishes the address
    await m1.queue("a").put(b"kept", {}, None)[2]
    await Store.crash_redis(m1)  # no release; (the 30 s lease is far from expired)
    m2 = QueueManager(parse_config(cfg))
    await m2.start()
    assert "a" not in m2.queues  # the lease is held by the previous run
    other = QueueManager(parse_config(cfg))  # a third gateway elsewhere does not take over
    await other.start()
    other.advertise("127.0.0.1", 6666)
    assert not await next(iter(other.leases.values())).claim()
    m2.advertise("127.0.0.1", 5555)
    assert await next(iter(m2.leases.values())).claim()
    assert [r.data for r in m2.queue("a").records.values()] == [b"kept"]
    await other.stop()
    await m2.stop()


async def _fenced(tmp_path: Path, url: str, lease_s: float = LEASE_S) -> tuple[QueueManager, RedisBackend]:
    """A started manager serving queue ``a``, and its backend, whose writes its lease fences."""
    m = _manager(tmp_path, url, lease_s=lease_s)
    await m.start()
    b = m.backend
    assert isinstance(b, RedisBackend) and b.fence is not None
    return m, b


def _records(idxs: range) -> list[Record]:
    return [Record(i, f"rid-{i}", {"k": "v"}, f"r{i}".encode()) for i in idxs]


async def test_a_batch_is_refused_whole_when_another_gateway_holds_the_lease(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    with redis_server.client(2) as c:
        c.flushdb()
    m, b = await _fenced(tmp_path, redis_server.url(2))
    await b.put("a", _records(range(1, 3)), 3)
    [lease] = m.leases.values()
    await lease.pause()  # no renewal puts this gateway's value back
    with redis_server.client(2) as c:
        c.set("easq:owner", "0123456789abcdef 10.0.0.9:8080")
    batches = b.batches
    # Submitted in one loop iteration: one batch.
    writes = [
        b.put("a", _records(range(3, 5)), 5),
        b.delete("a", [1], ["rid-1"]),
        b.ack("a", "g", [2]),
        b.add_group("a", "g", 1, {}),
    ]
    outcomes = await asyncio.gather(*writes, return_exceptions=True)
    assert all(isinstance(o, StorageError) and "no longer serves" in str(o) for o in outcomes), outcomes
    assert b.batches == batches and b.failure is not None and "no longer serves" in b.failure
    with redis_server.client(2) as c:
        assert [entry_id for entry_id, _ in c.xrange("easq:a:records")] == [b"1-0", b"2-0"]
        assert not c.exists("easq:a:removed", "easq:a:acks:g", "easq:a:groups")
        assert c.get("easq:owner") == b"0123456789abcdef 10.0.0.9:8080"
    await m.stop()


async def test_a_refused_command_fails_only_its_own_write(tmp_path: Path, redis_server: RedisServer) -> None:
    """Redis refuses an XADD whose id is not above the stream's last one; the other writes
    of the same fenced batch are applied and answered as such."""
    with redis_server.client(2) as c:
        c.flushdb()
    m, b = await _fenced(tmp_path, redis_server.url(2))
    await b.put("a", _records(range(1, 6)), 6)
    batches = b.batches
    below, above, group = (
        b.put("a", _records(range(3, 4)), 4),
        b.put("a", _records(range(9, 10)), 10),
        b.add_group("a", "g", 1, {}),
    )
    refused, *written = await asyncio.gather(below, above, group, return_exceptions=True)
    assert isinstance(refused, StorageError) and "equal or smaller" in str(refused)
    assert written == [None, None]
    assert b.batches == batches + 1  # one batch, answered per write
    with redis_server.client(2) as c:
        assert [_seq(e) for e, _ in c.xrange("easq:a:records")] == [1, 2, 3, 4, 5, 9]
        assert c.xrange("easq:a:records", "3-0", "3-0")[0][1][b"d"] == b"r3"  # not overwritten
        assert c.hexists("easq:a:groups", "g")
    await m.stop()


async def test_ten_thousand_indexes_in_one_fenced_commit_and_delete(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Commands naming this many ids are split: one command of them all would exceed what
    the script's unpack() can put on Lua's stack."""
    with redis_server.client(2) as c:
        c.flushdb()
    # Packing ten thousand records holds the event loop: on a busy machine longer than the
    # short lease the other tests use, and a lease that runs out fences the write (rightly).
    m, b = await _fenced(tmp_path, redis_server.url(2), lease_s=30.0)
    try:
        n = 10_000
        idxs = list(range(1, n + 1))
        await b.add_group("a", "g", 1, {})
        await b.add_group("a", "h", 1, {})
        await b.put("a", _records(range(1, n + 1)), n + 1)
        await b.ack("a", "g", idxs)
        with redis_server.client(2) as c:
            assert c.xlen("easq:a:records") == n and c.scard("easq:a:acks:g") == n
        await b.delete("a", idxs, [f"rid-{i}" for i in idxs])
        with redis_server.client(2) as c:
            assert c.xlen("easq:a:records") == 0 and c.scard("easq:a:acks:g") == 0
            [(stone_id, stone)] = c.xrange("easq:a:removed")
            assert stone[b"n"] == str(n).encode() and len(json.loads(stone[b"p"])) == n
        assert list(b._stones["a"]) == [(stone_id, n)]  # the tombstone's entry id was found
    finally:
        await m.stop()  # its Redis connections closed even when an assertion failed


def _calls(c: redis.Redis) -> dict[str, int]:
    stats = c.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}


async def test_a_fenced_write_is_one_round_trip(tmp_path: Path, redis_server: RedisServer) -> None:
    """One EVALSHA per batch: no WATCH, no GET of the lease from the client, no MULTI/EXEC."""
    with redis_server.client(2) as c:
        c.flushdb()
    m, _b = await _fenced(tmp_path, redis_server.url(2))
    q = m.queue("a")
    await q.put(b"first", {}, None)[2]  # loads the script into this server (once)
    with redis_server.client(2) as c:
        before = _calls(c)
        await q.put(b"second", {}, None)[2]
        after = _calls(c)
    grew = {cmd: after[cmd] - before.get(cmd, 0) for cmd in after if after[cmd] != before.get(cmd, 0)}
    assert grew.get("evalsha") == 1 and grew.get("xadd") == 1, grew
    assert not {"watch", "multi", "exec", "script|load", "script"} & grew.keys(), grew
    await m.stop()


async def test_without_a_lease_a_batch_is_one_transaction(redis_server: RedisServer) -> None:
    """A backend used directly (no owner lease) sends each batch as one MULTI/EXEC, answered
    per write as the fenced script is."""
    with redis_server.client(2) as c:
        c.flushdb()
    b = RedisBackend(redis_server.url(2))
    b.start(asyncio.get_running_loop())
    await b.put("a", _records(range(1, 4)), 4)
    with redis_server.client(2) as c:
        before = _calls(c)
        below, removal = b.put("a", _records(range(2, 3)), 3), b.delete("a", [1, 2], ["rid-1", "rid-2"])
        refused, removed = await asyncio.gather(below, removal, return_exceptions=True)
        after = _calls(c)
    assert isinstance(refused, StorageError) and removed is None
    grew = {cmd: after[cmd] - before.get(cmd, 0) for cmd in after if after[cmd] != before.get(cmd, 0)}
    assert grew.get("multi") == 1 and grew.get("exec") == 1 and "evalsha" not in grew, grew
    with redis_server.client(2) as c:
        assert [_seq(e) for e, _ in c.xrange("easq:a:records")] == [3]
        [(stone_id, _stone)] = c.xrange("easq:a:removed")
    assert list(b._stones["a"]) == [(stone_id, 2)]
    await b.aclose()
