"""Reading payloads back from the SQLite store: a record's payload leaves the gateway's
memory once durable (beyond the queue's ``memory_bytes``) and is read here when delivered.

Reads go through their own read-only connection, in the thread that asks (the event
loop): in WAL mode a reader sees the last committed transaction and never waits for the
writer, and a visible record is always committed. One read is one row by its rowid.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

from gateway.queue.backend import StorageError
from gateway.queue.sqlite_layout import table


class PayloadReader:
    """Reads one record's payload by queue table and index."""

    def __init__(self, path: str, writer_conn: sqlite3.Connection) -> None:
        self.path = path
        # An in-memory database exists on its one connection only: read through it.
        self._writer_conn = writer_conn
        self._conn: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self.path == ":memory:":
            return self._writer_conn
        if self._conn is None:
            uri = Path(self.path).resolve().as_uri() + "?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA busy_timeout=5000")
        return self._conn

    def read(self, qid: int | None, idx: int) -> bytes | None:
        """The payload of record ``idx`` of queue ``qid``; None if it is not there."""
        if qid is None:
            return None
        sql = f"SELECT data FROM {table(qid, idx)} WHERE idx = ?"  # noqa: S608 (s_<int>_<int>)
        try:
            row = self._connection().execute(sql, (idx,)).fetchone()
        except sqlite3.Error as exc:
            raise StorageError(f"queue storage read failed: {exc}") from exc
        return bytes(row[0]) if row is not None else None

    def free_bytes(self) -> int | None:
        """Free disk space where the database lives (None for an in-memory database)."""
        if self.path == ":memory:":
            return None
        return shutil.disk_usage(os.path.dirname(os.path.abspath(self.path))).free

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None
