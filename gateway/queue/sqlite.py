"""Embedded durable backend: SQLite in WAL mode, one writer thread, group commit.

Every change the store journals becomes one op on a FIFO; the writer thread takes
all ops waiting (up to ``MAX_BATCH``), runs them in one transaction, commits, and
then completes their futures on the event loop in order. So "put answered" means
"the transaction holding it committed":

* ``fsync: normal`` (default): ``synchronous=NORMAL`` in WAL mode. A commit is a
  write() into the WAL file (the OS page cache), so an acknowledged put survives
  ``kill -9`` of the gateway, but not a power loss or kernel crash.
* ``fsync: always``: ``synchronous=FULL``; each group commit fsyncs the WAL, so an
  acknowledged put survives power loss too.

Indexes never repeat: ``meta.next_idx`` is written in the same transaction as the
records it allocated. Deliveries are not journalled: after a restart every
consumer is gone, so whatever was outstanding is delivered again (at least once).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue as _stdqueue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from .store import Durable, Record

log = logging.getLogger(__name__)

MAX_BATCH = 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    queue TEXT NOT NULL, idx INTEGER NOT NULL, rid TEXT NOT NULL, tags TEXT NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (queue, idx));
CREATE TABLE IF NOT EXISTS meta (queue TEXT PRIMARY KEY, next_idx INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS groups (
    queue TEXT NOT NULL, gid TEXT NOT NULL, start INTEGER NOT NULL, tags TEXT NOT NULL,
    PRIMARY KEY (queue, gid));
CREATE TABLE IF NOT EXISTS acks (
    queue TEXT NOT NULL, gid TEXT NOT NULL, idx INTEGER NOT NULL, PRIMARY KEY (queue, gid, idx));
"""

_Op = Callable[[sqlite3.Connection], None]


class StorageError(Exception):
    """The database refused a write (disk full, read-only, I/O error)."""


class SqliteBackend:
    name = "sqlite"

    def __init__(self, path: str, fsync: str = "normal") -> None:
        if fsync not in ("normal", "always"):
            raise ValueError("fsync must be 'normal' or 'always'")
        self.path = path
        self.fsync = fsync
        if path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._conn = self._open()
        self._ops: _stdqueue.SimpleQueue[tuple[_Op, asyncio.Future[None]] | None] = _stdqueue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.batches = 0
        self.ops = 0
        self.errors = 0

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if self.fsync == 'always' else 'NORMAL'}")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.executescript(_SCHEMA)
        return conn

    # ------------------------------------------------------------------ lifecycle
    def recover(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}

        def q(name: str) -> dict[str, Any]:
            return out.setdefault(name, {"next_idx": 1, "records": [], "groups": [], "acks": []})

        c = self._conn
        for name, nxt in c.execute("SELECT queue, next_idx FROM meta"):
            q(name)["next_idx"] = nxt
        for name, idx, rid, tags, data in c.execute(
            "SELECT queue, idx, rid, tags, data FROM records ORDER BY queue, idx"
        ):
            q(name)["records"].append((idx, rid, json.loads(tags), bytes(data)))
        for name, gid, start, tags in c.execute("SELECT queue, gid, start, tags FROM groups"):
            q(name)["groups"].append((gid, start, json.loads(tags)))
        for name, gid, idx in c.execute("SELECT queue, gid, idx FROM acks"):
            q(name)["acks"].append((gid, idx))
        return out

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="queue-sqlite-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._ops.put(None)
            self._thread.join(timeout=10)
            self._thread = None
        try:
            self._conn.close()
        except sqlite3.Error:
            pass

    # ------------------------------------------------------------------ writer thread
    def _run(self) -> None:
        conn = self._conn
        loop = self._loop
        assert loop is not None
        stop = False
        while not stop:
            first = self._ops.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    nxt = self._ops.get_nowait()
                except _stdqueue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            err: BaseException | None = None
            try:
                conn.execute("BEGIN IMMEDIATE")
                for op, _ in batch:
                    op(conn)
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                err = exc
                self.errors += 1
                log.error("queue storage write failed: %s", exc)
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            self.batches += 1
            self.ops += len(batch)
            futs = [f for _, f in batch]
            try:
                loop.call_soon_threadsafe(_complete, futs, err)
            except RuntimeError:  # loop closed during shutdown
                break

    def _submit(self, op: _Op) -> Durable:
        if self._loop is None:
            # Not started (offline use, tests): write synchronously.
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            op(conn)
            conn.execute("COMMIT")
            return None
        fut: asyncio.Future[None] = self._loop.create_future()
        fut.add_done_callback(_retrieve)  # a failure nobody awaits is logged once, not warned about
        self._ops.put((op, fut))
        return fut

    # ------------------------------------------------------------------ journal ops
    def put(self, queue: str, records: list[Record], next_idx: int) -> Durable:
        rows = [(queue, r.idx, r.rid, json.dumps(r.tags), r.data) for r in records]

        def op(c: sqlite3.Connection) -> None:
            c.executemany("INSERT INTO records (queue, idx, rid, tags, data) VALUES (?, ?, ?, ?, ?)", rows)
            c.execute(
                "INSERT INTO meta (queue, next_idx) VALUES (?, ?) "
                "ON CONFLICT(queue) DO UPDATE SET next_idx = max(next_idx, excluded.next_idx)",
                (queue, next_idx),
            )

        return self._submit(op)

    def delete(self, queue: str, idxs: list[int]) -> Durable:
        rows = [(queue, i) for i in idxs]

        def op(c: sqlite3.Connection) -> None:
            c.executemany("DELETE FROM records WHERE queue = ? AND idx = ?", rows)
            c.executemany("DELETE FROM acks WHERE queue = ? AND idx = ?", rows)

        return self._submit(op)

    def ack(self, queue: str, gid: str, idxs: list[int]) -> Durable:
        rows = [(queue, gid, i) for i in idxs]

        def op(c: sqlite3.Connection) -> None:
            c.executemany("INSERT OR IGNORE INTO acks (queue, gid, idx) VALUES (?, ?, ?)", rows)

        return self._submit(op)

    def add_group(self, queue: str, gid: str, start: int, tags: dict[str, str]) -> Durable:
        row = (queue, gid, start, json.dumps(tags))

        def op(c: sqlite3.Connection) -> None:
            c.execute("INSERT OR IGNORE INTO groups (queue, gid, start, tags) VALUES (?, ?, ?, ?)", row)

        return self._submit(op)


def _retrieve(f: asyncio.Future[None]) -> None:
    if not f.cancelled():
        f.exception()


def _complete(futs: list[asyncio.Future[None]], err: BaseException | None) -> None:
    for f in futs:
        if f.done():
            continue
        if err is None:
            f.set_result(None)
        else:
            f.set_exception(StorageError(f"queue storage write failed: {err}"))
