"""The record log's bounds on the SQLite store: payloads beyond ``memory_bytes`` live on disk
only (and are read back when delivered), the byte cap per queue and the byte cap of a get."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.config import parse_config
from gateway.queue.manager import QueueManager
from gateway.queue.records import QueueError
from gateway.queue.server import build_app
from gateway.queue.sqlite_layout import table
from gateway.queue.store import Queue
from tests.e2e.queue.server_proc import TOKEN, queue_config

KIB = 1024


def manager(tmp_path: Path, **queue: Any) -> QueueManager:
    return QueueManager(parse_config(queue_config(tmp_path / "data", ["a"], **queue)))


async def put_all(q: Queue, payloads: list[bytes]) -> list[int]:
    out = []
    for p in payloads:
        idx, _rid, dur = q.put(p, {}, None)
        if dur is not None:
            await dur
        out.append(idx)
    return out


def payloads(n: int, size: int) -> list[bytes]:
    return [bytes([i % 251]) * size for i in range(n)]


async def test_payloads_beyond_memory_bytes_stay_on_disk_and_come_back(tmp_path: Path) -> None:
    m = manager(tmp_path, memory_bytes=10 * KIB, max_payload_bytes=4 * KIB)
    await m.start()
    q = m.queue("a")
    data = payloads(20, 4 * KIB)
    idxs = await put_all(q, data)
    in_memory = [r for r in q.records.values() if r.data is not None]
    assert len(in_memory) == 2 and q.cached_bytes == 8 * KIB  # the cache holds 2 of 4 KiB
    assert q.bytes == 20 * 4 * KIB
    # Delivered (watch) and read (get) byte-identical, whether in memory or on disk.
    c, _ = q.connect("g", "u", 0, 10, False, {})
    items, _ = q.take(c)
    assert [q.payload(r) for r, _n in items] == data[:10]
    got, dur = q.get(11, 10, True, None, {})
    await dur
    assert [r.data for r in got] == data[10:]
    assert q.bytes == 10 * 4 * KIB
    await m.stop()

    # After a restart the store knows every record but holds none of their payloads.
    m2 = manager(tmp_path, memory_bytes=10 * KIB, max_payload_bytes=4 * KIB)
    await m2.start()
    q2 = m2.queue("a")
    assert sorted(q2.records) == idxs[:10]
    assert all(r.data is None for r in q2.records.values()) and q2.cached_bytes == 0
    assert q2.bytes == 10 * 4 * KIB
    got, _ = q2.get(0, 10, False, None, {})
    assert [r.data for r in got] == data[:10]
    assert all(r.data is None for r in q2.records.values())  # read back, not kept
    await m2.stop()


async def test_removed_payload_leaves_the_cache(tmp_path: Path) -> None:
    m = manager(tmp_path, memory_bytes=8 * KIB, max_payload_bytes=4 * KIB)
    await m.start()
    q = m.queue("a")
    await put_all(q, payloads(2, 4 * KIB))
    assert q.cached_bytes == 8 * KIB
    await q.delete([1])
    assert q.cached_bytes == 4 * KIB
    await put_all(q, payloads(1, 4 * KIB))
    assert q.records[3].data is not None  # room again
    await m.stop()


async def test_get_returns_at_most_max_get_bytes_but_always_one_record(tmp_path: Path) -> None:
    m = manager(tmp_path, max_get_bytes=10 * KIB, max_payload_bytes=16 * KIB)
    await m.start()
    q = m.queue("a")
    await put_all(q, [b"x" * (4 * KIB)] * 5 + [b"y" * (16 * KIB)])
    got, _ = q.get(0, 100, False, None, {})
    assert [r.idx for r in got] == [1, 2]  # a third would pass 10 KiB
    got, _ = q.get(6, 100, False, None, {})
    assert [r.idx for r in got] == [6]  # bigger than the cap alone: still answered
    await m.stop()


async def test_max_bytes_refuses_a_put_with_429(tmp_path: Path) -> None:
    m = manager(tmp_path, max_bytes=10 * KIB)
    await m.start()
    q = m.queue("a")
    await put_all(q, payloads(2, 4 * KIB))
    with pytest.raises(QueueError) as err:
        q.put(b"z" * (4 * KIB), {}, None)
    assert err.value.status == 429 and "max_bytes 10240" in err.value.message
    await q.delete([1])  # room again
    await put_all(q, payloads(1, 4 * KIB))
    await m.stop()


async def test_default_max_bytes_is_half_the_free_disk_plus_what_the_queue_holds(tmp_path: Path) -> None:
    m = manager(tmp_path)
    await m.start()
    q = m.queue("a")
    half = shutil.disk_usage(tmp_path).free // 2
    assert abs(q.max_bytes - half) < 64 * 1024 * 1024  # other writers on the disk move it a little
    await put_all(q, payloads(3, 1000))
    await m.stop()
    m2 = manager(tmp_path)
    await m2.start()
    q2 = m2.queue("a")
    assert q2.bytes == 3000
    assert abs(q2.max_bytes - (3000 + shutil.disk_usage(tmp_path).free // 2)) < 64 * 1024 * 1024
    await m2.stop()


async def test_a_payload_gone_from_disk_reads_as_gone(tmp_path: Path) -> None:
    m = manager(tmp_path, memory_bytes=0)
    await m.start()
    q = m.queue("a")
    await put_all(q, payloads(2, 100))
    with sqlite3.connect(tmp_path / "data" / "queues.sqlite3") as conn:
        conn.execute(f"DELETE FROM {table(1, 1)} WHERE idx = 1")  # noqa: S608 (s_<int>_<int>)
    conn.close()
    assert q.payload(q.records[1]) is None
    got, _ = q.get(0, 10, False, None, {})
    assert [r.idx for r in got] == [2]  # the vanished one is skipped, not answered empty
    await m.stop()


async def test_a_record_bigger_than_max_bytes_is_413(tmp_path: Path) -> None:
    """It could never fit: 413 like a record over max_payload_bytes, not a 429 to retry forever."""
    m = manager(tmp_path, max_bytes=1000)
    await m.start()
    with pytest.raises(QueueError) as err:
        m.queue("a").put(b"x" * 1001, {}, None)
    assert err.value.status == 413 and "max_bytes 1000" in err.value.message
    assert m.queue("a").snapshot()["bytes"] == 0
    await m.stop()


async def test_auto_commit_hands_out_payloads_read_before_the_commit_deletes_them(tmp_path: Path) -> None:
    """An auto-commit hand-out deletes its records at once: their payloads come with them,
    a slice of about AUTO_COMMIT_BYTES at a time (not a whole slice of large records)."""
    m = manager(tmp_path, memory_bytes=0, max_payload_bytes=512 * KIB)
    await m.start()
    q = m.queue("a")
    data = payloads(8, 300 * KIB)
    await put_all(q, data)
    assert all(r.data is None for r in q.records.values())
    c, _ = q.connect("g", "u", 0, 0, True, {})
    got: list[bytes | None] = []
    while True:
        items, dur = q.take(c)
        if not items:
            break
        assert len(items) <= 4  # 4 x 300 KiB passes 1 MiB
        await dur  # deleted on disk now
        got += [q.payload(r) for r, _n in items]
    assert got == data and q.length == 0
    await m.stop()


async def test_an_unreadable_payload_is_507_and_the_server_stays_up(tmp_path: Path) -> None:
    cfg = parse_config(queue_config(tmp_path / "data", ["a", "b"], memory_bytes=0))
    server = TestServer(build_app(cfg), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession(headers={"Authorization": TOKEN}) as http:
            for name in ("a", "b"):
                async with http.post(server.make_url(f"/api/predict/{name}"), data=b"payload") as resp:
                    assert resp.status == 200
            with sqlite3.connect(tmp_path / "data" / "queues.sqlite3") as conn:
                conn.execute(f"DROP TABLE {table(1, 1)}")  # queue a's records, gone from under the store
            conn.close()
            async with http.get(server.make_url("/api/predict/a?_timeout_=0s")) as resp:
                assert resp.status == 507 and "storage" in await resp.text()
            async with http.get(server.make_url("/api/predict/b?_timeout_=0s")) as resp:
                assert resp.status == 200 and b"payload" in await resp.read()
    finally:
        await server.close()
