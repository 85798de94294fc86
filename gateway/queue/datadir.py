"""The embedded queue store's data directory: one gateway at a time, and a store that went
missing or was damaged is an error at start, never an empty queue.

* ``queues.lock``: an exclusive ``flock`` held for as long as the store is open, holding the
  holder's pid. A second gateway on the same directory is refused naming the directory and
  that pid. The kernel drops the lock when its holder dies (``kill -9`` included), so a
  stale file never blocks a restart; the descriptor is not inheritable, so a worker process
  (started with exec) never holds it.
* ``queues.created``: written once the database exists. If it is there and the database is
  not, the database was deleted (or the wrong directory was mounted): starting with an empty
  store would silently lose every queued record, so the start fails naming the file.
* The database itself is checked before use: its SQLite header, its size against the page
  count the header states (a truncated copy), and ``PRAGMA quick_check`` when the file is at
  most ``QUICK_CHECK_MAX_BYTES`` (it reads the whole file). A file shorter than its header
  says beside a -wal file is what a crash during a checkpoint leaves (the header page is
  copied first): the checkpoint is completed from the WAL, then the file is checked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import time

from gateway.queue.private_files import private_file
from gateway.queue.sqlite import SqliteBackend

LOCK_FILE = "queues.lock"
MARKER_FILE = "queues.created"
QUICK_CHECK_MAX_BYTES = 256 * 1024 * 1024
_MAGIC = b"SQLite format 3\x00"


class StoreUnusable(RuntimeError):
    """The queue store cannot be opened safely (locked, missing, corrupt, unwritable)."""


class DataDirLock:
    """An exclusive lock on a data directory for the life of this object (or the process)."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, LOCK_FILE)
        try:
            private_file(self.path)
            fd = os.open(self.path, os.O_RDWR)
        except OSError as exc:
            raise StoreUnusable(f"cannot create the lock file {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_pid(fd)
            os.close(fd)
            raise StoreUnusable(
                f"data directory {data_dir} is in use by another gateway (pid {holder or 'unknown'}, "
                f"lock file {self.path}); give each gateway its own gateway.data_dir"
            ) from None
        with contextlib.suppress(OSError):  # the pid is information only; the lock is what counts
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _read_pid(fd: int) -> str:
    try:
        raw = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return raw if raw.isdigit() else ""


def check_existing(db_path: str) -> None:
    """Refuse a store the marker says exists but is gone, or one that is not sound."""
    marker = os.path.join(os.path.dirname(os.path.abspath(db_path)), MARKER_FILE)
    if not os.path.exists(db_path):
        if os.path.exists(marker):
            raise StoreUnusable(
                f"queue store {db_path} is missing, but {marker} records that it was created: "
                "its records would be lost. Restore the file, or delete the marker to start "
                "with empty queues"
            )
        return
    try:
        size = os.path.getsize(db_path)
        with open(db_path, "rb") as f:
            header = f.read(100)
    except OSError as exc:
        raise StoreUnusable(f"cannot read the queue store {db_path}: {exc.strerror or exc}") from None
    if size == 0:
        # Until the first checkpoint a new store's pages are all in its -wal file; with
        # neither, a store the marker says was created has lost everything.
        wal = db_path + "-wal"
        if os.path.exists(marker) and (not os.path.exists(wal) or os.path.getsize(wal) == 0):
            raise StoreUnusable(f"queue store {db_path} is empty, but {marker} records that it was created")
        return
    if len(header) < 100 or header[:16] != _MAGIC:
        raise StoreUnusable(f"queue store {db_path} is not an SQLite database (corrupt or overwritten)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The page count in the header is valid when the two change counters agree.
    if header[24:28] == header[92:96] and pages and size < pages * page_size:
        wal = db_path + "-wal"
        if os.path.exists(wal) and os.path.getsize(wal) > 0:
            _checkpoint(db_path)  # the WAL is emptied: checked again, the file stands on its own
            return check_existing(db_path)
        raise StoreUnusable(
            f"queue store {db_path} is truncated ({size} bytes; its header says {pages * page_size})"
        )
    if size <= QUICK_CHECK_MAX_BYTES:
        _quick_check(db_path)


def _checkpoint(db_path: str) -> None:
    try:
        conn = sqlite3.connect(db_path, isolation_level=None)
        try:
            busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreUnusable(f"queue store {db_path} is unreadable: {exc}") from None
    if busy:
        raise StoreUnusable(f"queue store {db_path}: its -wal file could not be written back")


def _quick_check(db_path: str) -> None:
    try:
        conn = sqlite3.connect(db_path, isolation_level=None)
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreUnusable(f"queue store {db_path} is unreadable: {exc}") from None
    problems = [str(r[0]) for r in rows if r and r[0] != "ok"]
    if problems:
        raise StoreUnusable(f"queue store {db_path} is corrupt: {'; '.join(problems[:3])}")


def mark_created(db_path: str) -> None:
    """Record that the store exists (once; an existing marker is left as it is)."""
    marker = os.path.join(os.path.dirname(os.path.abspath(db_path)), MARKER_FILE)
    if os.path.exists(marker):
        return
    private_file(marker)
    with open(marker, "w", encoding="utf-8") as f:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        f.write(f"queue store {os.path.basename(db_path)} created {when}\n")


class LockedSqliteBackend(SqliteBackend):
    """The SQLite backend holding its data directory's lock until it closes."""

    lock: DataDirLock | None = None

    def close(self, next_idx: dict[str, int] | None = None) -> None:
        try:
            super().close(next_idx)
        finally:
            if self.lock is not None:
                self.lock.release()


def open_store(data_dir: str, db_file: str, fsync: str) -> SqliteBackend:
    """Lock the data directory, check what is there and open the store in it."""
    lock = DataDirLock(data_dir)
    path = os.path.join(data_dir, db_file)
    try:
        check_existing(path)
        try:
            backend = LockedSqliteBackend(path, fsync=fsync)
        except (sqlite3.Error, OSError) as exc:
            # A read-only directory or a file in the way of the database or its -wal and -shm
            # (the shared-memory index SQLite maps) fails here, with SQLite's reason.
            raise StoreUnusable(f"cannot open the queue store {path}: {exc}") from None
        try:
            mark_created(path)
        except OSError as exc:
            backend.close()
            raise StoreUnusable(
                f"cannot write in the data directory {data_dir}: {exc.strerror or exc}"
            ) from None
    except BaseException:
        lock.release()
        raise
    backend.lock = lock
    return backend


__all__ = [
    "LOCK_FILE",
    "MARKER_FILE",
    "DataDirLock",
    "LockedSqliteBackend",
    "StoreUnusable",
    "check_existing",
    "mark_created",
    "open_store",
]
