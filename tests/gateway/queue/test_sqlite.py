"""The SQLite backend: what a restart keeps, the fsync setting, and a failing disk."""

from __future__ import annotations

import json
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
from gateway.queue.store import QueueError
from tests.e2e.queue.server_proc import TOKEN, queue_config


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


def _crash(m: QueueManager) -> None:
    """Stop writing without a clean stop, as a kill -9 would (what is committed stays)."""
    m.backend._ckpt_stop.set()
    m.backend._conn.close()


async def test_removed_records_are_remembered_across_a_crash(tmp_path: Path) -> None:
    """A commit repeated after a restart is OK and a put retried with the request id of a
    consumed record returns its index without storing it again."""
    m = manager(tmp_path)
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
    _crash(m)

    m2 = manager(tmp_path)
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


async def test_tombstones_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.queue.recordlog as recordlog_mod
    import gateway.queue.sqlite as sqlite_mod

    monkeypatch.setattr(sqlite_mod, "RECENT_LIMIT", 10)
    monkeypatch.setattr(sqlite_mod, "PRUNE_EVERY", 8)
    monkeypatch.setattr(recordlog_mod, "RECENT_LIMIT", 10)
    m = manager(tmp_path)
    await m.start()
    q = m.queue("a")
    for i in range(40):
        await q.put(b"x", {}, f"r{i}")[2]
        await q.delete([i + 1])
    assert len(q.recent) == 10 and next(iter(q.recent)) == 31
    await m.stop()
    with sqlite3.connect(tmp_path / "data" / "queues.sqlite3") as conn:
        kept = [idx for (items,) in conn.execute("SELECT items FROM t_1") for idx, _rid in json.loads(items)]
    conn.close()
    assert len(kept) <= 10 + 8 and min(kept) >= 40 - 10 - 8 + 1
    m2 = manager(tmp_path)
    await m2.start()
    assert list(m2.queue("a").recent) == list(range(31, 41))
    await m2.stop()


async def test_database_without_tombstones_is_migrated(tmp_path: Path) -> None:
    m = manager(tmp_path)
    await m.start()
    await m.queue("a").put(b"x", {}, "old")[2]
    await m.stop()
    with sqlite3.connect(tmp_path / "data" / "queues.sqlite3") as conn:  # as an older version wrote it
        conn.execute("DROP TABLE t_1")
    conn.close()
    m2 = manager(tmp_path)
    await m2.start()
    q = m2.queue("a")
    await q.delete([1])
    _crash(m2)
    m3 = manager(tmp_path)
    await m3.start()
    assert list(m3.queue("a").recent.items()) == [(1, "old")]
    await m3.stop()


async def test_group_filter_change_is_kept(tmp_path: Path) -> None:
    m = manager(tmp_path)
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
    _crash(m)
    m2 = manager(tmp_path)
    await m2.start()
    q2 = m2.queue("a")
    assert q2.groups["g"].tags == {"color": "blue"}
    await m2.stop()


async def test_data_files_are_private(tmp_path: Path) -> None:
    m = manager(tmp_path)
    await m.start()
    await m.queue("a").put(b"secret payload", {}, None)[2]
    data = tmp_path / "data"
    modes = {p.name: p.stat().st_mode & 0o777 for p in data.iterdir()}
    await m.stop()
    assert data.stat().st_mode & 0o777 == 0o700
    assert modes and set(modes.values()) == {0o600}, modes
