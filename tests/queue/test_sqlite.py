"""The SQLite backend: what a restart keeps, the fsync setting, and a failing disk (Q8)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from eas_sdk.errors import HTTPStatusError
from eas_sdk.queue import AsyncQueueClient
from gateway.config import QueueConfig, parse_config
from gateway.queue.manager import QueueManager
from gateway.queue.server import MANAGER_KEY, build_app
from gateway.queue.sqlite import SqliteBackend

from .server_proc import TOKEN, queue_config


def manager(tmp_path: Path, fsync: str = "normal") -> QueueManager:
    cfg = parse_config(queue_config(tmp_path / "data", ["a", "b"], fsync=fsync))
    return QueueManager(cfg)


async def test_restart_keeps_records_indexes_and_group_state(tmp_path: Path) -> None:
    m = manager(tmp_path)
    await m.start()
    q = m.queue("a")
    idxs = []
    for i in range(5):
        idx, _rid, dur = q.put(f"r{i}".encode(), {"k": str(i)}, None)
        await dur
        idxs.append(idx)
    # Two groups: g1 commits 1 and 2, g2 commits 1 -> 1 is gone, 2 waits for g2.
    c1, _ = q.connect("g1", "u1", 0, 5, False, {})
    c2, _ = q.connect("g2", "u2", 0, 5, False, {})
    q.take(c1)
    q.take(c2)
    await q.commit("g1", [1, 2])
    await q.commit("g2", [1])
    dur = q.delete([5])  # the highest index is gone: it must never be reused
    await dur
    await m.stop()
    assert sorted(q.records) == [2, 3, 4]

    m2 = manager(tmp_path)
    await m2.start()
    q2 = m2.queue("a")
    assert sorted(q2.records) == [2, 3, 4]
    assert q2.records[3].tags == {"k": "2", "requestId": q.records[3].rid}
    assert q2.groups["g1"].committed == {2} and not q2.groups["g2"].committed
    idx, _rid, dur = q2.put(b"new", {}, None)
    await dur
    assert idx == 6
    # After the restart g1 is owed 3 and 4 (2 it committed); g2 is owed 2, 3, 4.
    c1, _ = q2.connect("g1", "u1", 0, 10, False, {})
    assert [r.idx for r, _ in q2.take(c1)[0]] == [3, 4, 6]
    c2, _ = q2.connect("g2", "u9", 0, 10, False, {})
    assert [r.idx for r, _ in q2.take(c2)[0]] == [2, 3, 4, 6]
    await m2.stop()


async def test_crash_restart_index_reservation(tmp_path: Path) -> None:
    """Without a clean stop (no final meta write) indexes still continue above every used one."""
    m = manager(tmp_path)
    await m.start()
    q = m.queue("b")
    for _ in range(3):
        await q.put(b"x", {}, None)[2]
    await q.delete([3])
    m.backend._ckpt_stop.set()
    m.backend._conn.close()  # simulate a crash: nothing more is written
    m2 = manager(tmp_path)
    await m2.start()
    idx, _, dur = m2.queue("b").put(b"y", {}, None)
    await dur
    assert idx > 3
    await m2.stop()


@pytest.mark.parametrize(("fsync", "level", "writer"), [("normal", 1, "loop"), ("always", 2, "thread")])
async def test_fsync_setting(tmp_path: Path, fsync: str, level: int, writer: str) -> None:
    m = manager(tmp_path, fsync)
    assert isinstance(m.backend, SqliteBackend)
    assert m.backend.writer == writer
    assert m.backend._conn.execute("PRAGMA synchronous").fetchone()[0] == level
    assert m.backend._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    await m.start()
    await m.queue("a").put(b"x", {}, None)[2]
    await m.stop()
    with sqlite3.connect(tmp_path / "data" / "queues.sqlite3") as conn:
        assert conn.execute("SELECT count(*) FROM r_1").fetchone()[0] == 1
    conn.close()


async def test_failing_storage_answers_507_and_recovers(tmp_path: Path) -> None:
    cfg = parse_config(queue_config(tmp_path / "data", ["a"]))
    app = build_app(cfg)
    async with TestServer(app, host="127.0.0.1") as server:
        backend = app[MANAGER_KEY].backend
        assert isinstance(backend, SqliteBackend)
        async with AsyncQueueClient(f"127.0.0.1:{server.port}", "a") as client:
            client.set_token(TOKEN)
            client.set_retry_count(0)
            client.init()
            await client.put(b"before")
            backend._conn.execute("PRAGMA query_only=1")  # every write now fails like a read-only disk
            with pytest.raises(HTTPStatusError) as info:
                await client.put(b"refused")
            assert info.value.code == 507
            backend._conn.execute("PRAGMA query_only=0")
            index, _ = await client.put(b"after")
            got = await client.get(length=10, auto_delete=False, timeout="0s")
            assert [d.data for d in got] == [b"before", b"after"]
            assert int(index) == 3  # the refused put's index is not reused


def test_queue_config_defaults() -> None:
    assert QueueConfig().fsync == "normal"  # survives kill -9; "always" for power loss


async def test_shutdown_with_a_silent_watcher_and_a_long_poll_is_bounded(tmp_path: Path) -> None:
    import asyncio

    cfg = parse_config(queue_config(tmp_path / "data", ["a"]))
    app = build_app(cfg)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        b"GET /api/predict/a?_watch_=true&_window_=1 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        b"Authorization: " + TOKEN.encode() + b"\r\n\r\n"
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101")
    client = AsyncQueueClient(f"127.0.0.1:{server.port}", "a")
    client.set_token(TOKEN)
    client.init()
    long_poll = asyncio.ensure_future(client.get(timeout="30s"))
    await asyncio.sleep(0.2)
    await server.close()  # a watch whose peer never answers the close frame, and a 30 s long poll
    assert await long_poll == []  # answered at shutdown, not after 30 s
    frame = await asyncio.wait_for(reader.read(64), 5)
    assert frame[0] == 0x88 and int.from_bytes(frame[2:4], "big") == 1001  # "going away" from shutdown()
    await client.close()
    writer.close()
