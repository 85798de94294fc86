"""The Redis backend's own promises: its key layout, the persistence it needs for
``fsync``, and acknowledged records surviving a kill -9 of the Redis server itself."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.config import parse_config
from gateway.queue.backend import StorageError
from gateway.queue.manager import QueueManager
from gateway.queue.redis_backend import RedisBackend, redacted
from tests.e2e.queue.server_proc import queue_config
from tests.gateway.queue.test_backend_conformance import LEASE_S, Store
from tests.redis_server import RedisServer


def _manager(tmp_path: Path, url: str, fsync: str = "normal") -> QueueManager:
    cfg = queue_config(tmp_path / "data", ["a"], backend=url, fsync=fsync, owner_lease_s=LEASE_S)
    return QueueManager(parse_config(cfg))


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
        m = _manager(tmp_path, server.url(0))
        await m.start()
        q = m.queue("a")
        for i in range(50):
            await q.put(f"r{i}".encode(), {}, None)[2]
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
