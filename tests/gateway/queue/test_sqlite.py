"""The SQLite backend's own settings and files: the fsync setting, tombstone pruning, an older
database, a bounded shutdown. What every backend promises is in test_backend_conformance.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from eas_sdk.queue import AsyncQueueClient
from gateway.config import QueueConfig, parse_config
from gateway.queue.manager import QueueManager
from gateway.queue.records import Record
from gateway.queue.server import build_app
from gateway.queue.sqlite import SqliteBackend
from gateway.queue.sqlite_layout import table
from tests.e2e.queue.server_proc import TOKEN, queue_config


def manager(tmp_path: Path, fsync: str = "normal") -> QueueManager:
    cfg = parse_config(queue_config(tmp_path / "data", ["a", "b"], fsync=fsync))
    return QueueManager(cfg)


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
        assert conn.execute(f"SELECT count(*) FROM {table(1, 1)}").fetchone()[0] == 1  # noqa: S608
    conn.close()


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
    m.backend.lock.release()  # as the kernel drops a killed process's flock


async def test_tombstone_rows_are_pruned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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


async def test_data_files_are_private(tmp_path: Path) -> None:
    m = manager(tmp_path)
    await m.start()
    await m.queue("a").put(b"secret payload", {}, None)[2]
    data = tmp_path / "data"
    modes = {p.name: p.stat().st_mode & 0o777 for p in data.iterdir()}
    await m.stop()
    assert data.stat().st_mode & 0o777 == 0o700
    assert modes and set(modes.values()) == {0o600}, modes


@pytest.mark.parametrize("fsync", ["normal", "always"])
async def test_a_refused_first_write_leaves_the_queue_working(tmp_path: Path, fsync: str) -> None:
    """The first write to a queue creates its tables; refused (a read-only disk), the next
    write creates them, and what it wrote is there after a restart."""
    from gateway.queue.backend import StorageError

    m = manager(tmp_path, fsync)
    await m.start()
    q = m.queue("b")
    assert isinstance(m.backend, SqliteBackend)
    m.backend._conn.execute("PRAGMA query_only=1")
    with pytest.raises(StorageError):
        await q.put(b"refused", {}, None)[2]  # type: ignore[misc]
    m.backend._conn.execute("PRAGMA query_only=0")
    idx, _rid, dur = q.put(b"after", {}, None)
    await dur  # type: ignore[misc]
    await m.stop()
    m2 = manager(tmp_path, fsync)
    await m2.start()
    q2 = m2.queue("b")
    assert [q2.payload(r) for r in q2.records.values()] == [b"after"] and idx in q2.records
    await m2.stop()


def _wal_growth_of_removal(path: Path, secure_delete: str | None) -> int:
    """Bytes the WAL grows by when 100 committed 1 KiB records are removed."""
    b = SqliteBackend(str(path))
    if secure_delete is not None:
        b._conn.execute(f"PRAGMA secure_delete={secure_delete}")
    records = [Record(i, f"rid-{i}", {}, bytes([i % 256]) * 1024) for i in range(1, 301)]
    b.put("q", records, 301)
    wal = Path(f"{path}-wal")
    before = wal.stat().st_size
    b.delete("q", list(range(1, 101)), [f"rid-{i}" for i in range(1, 101)])
    grown = wal.stat().st_size - before
    b.close()
    return grown


def test_removals_do_not_zero_every_freed_page(tmp_path: Path) -> None:
    """Many SQLite builds zero every page a deletion frees, each one more page written to the
    WAL; the backend zeroes only what it writes anyway."""
    ours = _wal_growth_of_removal(tmp_path / "ours.sqlite3", None)
    zeroing = _wal_growth_of_removal(tmp_path / "zeroing.sqlite3", "ON")
    assert ours < zeroing * 0.95, (ours, zeroing)
