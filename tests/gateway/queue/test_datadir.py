"""The queue store's data directory, through the real gateway (``python -m gateway serve``):
a second gateway on the same directory is refused naming it and the holder's pid, a killed
holder does not block a restart, and a store that was deleted, overwritten, truncated or
cannot be opened stops the start with an error naming the file (never an empty queue)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eas_sdk.queue import QueueClient
from gateway.queue.datadir import LOCK_FILE, MARKER_FILE, StoreUnusable, check_existing
from gateway.queue.manager import DB_FILE
from gateway.queue.sqlite_layout import table
from tests.e2e.gateway_proc import ROOT, GatewayProcess
from tests.e2e.queue.server_proc import TOKEN

SERVICE = {"name": "jobs", "processor": "queue", "token": TOKEN}


def _config(data: Path) -> dict[str, Any]:
    return {"gateway": {"data_dir": str(data), "access_log": False}, "services": [SERVICE]}


def _refused(data: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    """Start a gateway on ``data`` that is expected to exit at once."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "services.yaml"
    path.write_text(yaml.safe_dump(_config(data)), encoding="utf-8")
    argv = [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(path),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]
    env = {**os.environ, "EASGW_LOOPBACK_ONLY": "1"}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)


def _client(gw: GatewayProcess) -> QueueClient:
    q = QueueClient(gw.endpoint, "jobs")
    q.set_token(TOKEN)
    q.init()
    return q


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data directory a real gateway wrote three records into and stopped cleanly."""
    work = tmp_path_factory.mktemp("datadir")
    gw = GatewayProcess.start(_config(work / "data"), work / "gw")
    try:
        q = _client(gw)
        for i in range(3):
            q.put(f"r{i}")
    finally:
        assert gw.stop() == 0
    yield work / "data"


def _copy(saved: Path, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(saved, data)
    (data / LOCK_FILE).unlink(missing_ok=True)
    return data


def test_second_gateway_is_refused_and_a_killed_one_does_not_block(saved: Path, tmp_path: Path) -> None:
    data = _copy(saved, tmp_path)
    first = GatewayProcess.start(_config(data), tmp_path / "first")
    try:
        second = _refused(data, tmp_path / "second")
        assert second.returncode != 0
        assert f"data directory {data} is in use by another gateway (pid {first.pid}" in second.stderr
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        third = GatewayProcess.start(_config(data), tmp_path / "third")
        try:
            assert int(_client(third).attributes()["stream.length"]) == 3
        finally:
            assert third.stop() == 0
    finally:
        first.kill()


def test_a_deleted_store_is_an_error_not_an_empty_queue(saved: Path, tmp_path: Path) -> None:
    data = _copy(saved, tmp_path)
    assert (data / MARKER_FILE).exists()
    for name in (DB_FILE, DB_FILE + "-wal", DB_FILE + "-shm"):
        (data / name).unlink(missing_ok=True)
    proc = _refused(data, tmp_path / "gw")
    assert proc.returncode == 1, proc.stderr
    assert f"queue store {data / DB_FILE} is missing" in proc.stderr
    assert not (data / DB_FILE).exists()  # nothing was created in its place


@pytest.mark.parametrize("damage", ["garbage", "truncated", "pages", "emptied"])
def test_a_damaged_store_is_an_error_naming_it(saved: Path, tmp_path: Path, damage: str) -> None:
    data = _copy(saved, tmp_path)
    db = data / DB_FILE
    raw = db.read_bytes()
    assert len(raw) >= 4 * 4096, len(raw)
    if damage == "garbage":
        db.write_bytes(b"this is not a database" * 500)
    elif damage == "truncated":
        db.write_bytes(raw[: len(raw) // 2])
    elif damage == "pages":  # the header is intact; every page after the first is overwritten
        db.write_bytes(raw[:4096] + b"\xa5" * (len(raw) - 4096))
    else:
        db.write_bytes(b"")
    proc = _refused(data, tmp_path / "gw")
    assert proc.returncode == 1, proc.stderr
    assert f"queue store {db} is" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_store_that_cannot_be_opened_is_an_error(saved: Path, tmp_path: Path) -> None:
    """SQLite maps its shared-memory index (the -shm file): a path it cannot create or write
    is a start-up error with SQLite's reason, never a crash."""
    data = _copy(saved, tmp_path)
    (data / (DB_FILE + "-shm")).unlink(missing_ok=True)
    (data / (DB_FILE + "-shm")).mkdir()  # in the way of the shared-memory file
    proc = _refused(data, tmp_path / "gw")
    assert proc.returncode == 1, proc.stderr
    assert f"cannot open the queue store {data / DB_FILE}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def _interrupted_checkpoint(folder: Path) -> tuple[Path, int]:
    """A store as a kill -9 in the middle of a checkpoint leaves it: the file holds the first
    pages the checkpoint copied (page 1, with the new page count, comes first) and is shorter
    than its header says; the -wal file still holds every page of the last transactions."""
    db = folder / DB_FILE
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (x BLOB)")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rows = 300
    conn.execute("BEGIN")
    for i in range(rows):
        conn.execute("INSERT INTO t VALUES (?)", (bytes([i % 256]) * 3000,))
    conn.execute("COMMIT")
    wal = (folder / (DB_FILE + "-wal")).read_bytes()  # the state at the kill, before the checkpoint
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    full = db.read_bytes()
    conn.close()
    db.write_bytes(full[: len(full) // 3])
    (folder / (DB_FILE + "-wal")).write_bytes(wal)
    (folder / (DB_FILE + "-shm")).unlink(missing_ok=True)
    return db, rows


def test_a_checkpoint_cut_short_by_a_kill_is_not_a_truncated_store(tmp_path: Path) -> None:
    db, rows = _interrupted_checkpoint(tmp_path)
    check_existing(str(db))  # the -wal file holds the missing pages: sound
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT count(*), sum(length(x)) FROM t").fetchone() == (rows, rows * 3000)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()


def test_a_short_store_whose_wal_cannot_supply_the_rest_is_refused(tmp_path: Path) -> None:
    db, _ = _interrupted_checkpoint(tmp_path)
    wal = tmp_path / (DB_FILE + "-wal")
    wal.write_bytes(wal.read_bytes()[:8192])
    with pytest.raises(StoreUnusable, match=r"is (truncated|unreadable: database disk image is malformed)"):
        check_existing(str(db))


def test_a_checkpoint_cut_short_by_a_crash_is_completed_not_refused(saved: Path, tmp_path: Path) -> None:
    """Killed while a checkpoint copied the WAL into the database (the header page goes
    first), the store is left shorter than its header says, with the rest in its -wal file:
    the start completes the checkpoint and every record is there."""
    import sqlite3

    data = _copy(saved, tmp_path)
    db = data / DB_FILE
    live = sqlite3.connect(db, isolation_level=None)
    live.execute("PRAGMA wal_autocheckpoint=0")
    rows = [(i, f"rid-{i}", f'{{"requestId": "rid-{i}"}}', bytes([i % 251]) * 4096) for i in range(4, 104)]
    live.executemany(f"INSERT INTO {table(1, 4)} (idx, rid, tags, data) VALUES (?, ?, ?, ?)", rows)  # noqa: S608 (s_<int>_<int>)
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    for name in (DB_FILE, DB_FILE + "-wal"):  # what a kill -9 leaves: the connection is still open
        shutil.copy(data / name, crashed / name)
    shutil.copy(data / MARKER_FILE, crashed / MARKER_FILE)
    live.close()
    # The header as the checkpoint writes it first, on the file as it was before.
    whole = tmp_path / "whole"
    shutil.copytree(crashed, whole)
    done = sqlite3.connect(whole / DB_FILE)
    done.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    done.close()
    header = (whole / DB_FILE).read_bytes()[:100]
    with open(crashed / DB_FILE, "r+b") as f:
        f.write(header)
    pages = int.from_bytes(header[28:32], "big") * int.from_bytes(header[16:18], "big")
    assert (crashed / DB_FILE).stat().st_size < pages  # what the size check refused
    gw = GatewayProcess.start(_config(crashed), tmp_path / "gw")
    try:
        assert int(_client(gw).attributes()["stream.length"]) == 3 + len(rows)
    finally:
        assert gw.stop() == 0
