"""Embedded durable backend: SQLite in WAL mode with group commit.

Every change the store journals becomes one op; ops are committed in batches, one
transaction per batch, and their futures complete in order only after the COMMIT
(``sqlite_commit``). So "put answered" means "the transaction holding it committed".
One connection writes, in one of two modes:

* ``fsync: normal`` (default): ``synchronous=NORMAL``. A commit is a write() into
  the WAL file (the OS page cache) and never an fsync, so it runs in the event
  loop. WAL checkpoints (which do fsync) run on a background connection every
  second. An acknowledged put survives ``kill -9`` of the gateway, not a power loss.
* ``fsync: always``: ``synchronous=FULL``; a writer thread commits and fsyncs the
  WAL on each commit, so an acknowledged put survives power loss too.

(``EASGW_QUEUE_WRITER=thread|loop`` overrides the mode, for measurements.)

Records live in rowid tables (rowid = index), a ring of them per queue, each holding
runs of consecutive indexes in turn (``sqlite_layout``): records removed from the front
of a queue are freed a table at a time instead of row by row. Indexes never repeat:
``meta.next_idx`` reserves blocks of ``INDEX_RESERVE`` indexes in the transaction that
first uses them, and a clean stop records the exact value.
Deliveries are not journalled: after a restart every consumer is gone, so whatever
was outstanding is delivered again (at least once).

Removed records leave tombstones ``(idx, rid)`` in ``t_<qid>``, one row per removal (a
JSON list of the pairs) written in the removal's own transaction: a per-record row would
cost about as much again as deleting the record. Rows removed above the queue's floor
are deleted in the same transaction, contiguous indexes by one range statement. The
store loads the newest ``RECENT_LIMIT`` tombstones on start: a commit repeated after a
restart is still OK and a put retried with a consumed record's request id still returns
its index. Every ``PRUNE_EVERY`` removals of a queue, the removal's transaction also
drops the rows wholly beyond the newest ``RECENT_LIMIT``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import threading
from operator import itemgetter
from typing import Any

from gateway.queue import sqlite_layout as layout
from gateway.queue.backend import StorageError
from gateway.queue.durable import Written
from gateway.queue.private_files import private_file
from gateway.queue.records import RECENT_LIMIT, Record
from gateway.queue.sqlite_commit import GroupCommit, Op
from gateway.queue.sqlite_read import PayloadReader

__all__ = ["SqliteBackend", "StorageError"]

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_S = 1.0

# Tombstones beyond the newest RECENT_LIMIT are pruned once per this many removals.
PRUNE_EVERY = 4096

# Reserve index blocks in meta so that a put does not rewrite the meta row each time:
# after a crash the indexes continue above the reservation (a gap, never a reuse).
INDEX_RESERVE = 1024

# Records live in rowid tables (rowid = index: a single B-tree per insert), see sqlite_layout;
# ``floors``: per queue, the index below which no row is a record any more.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS qmap (queue TEXT PRIMARY KEY, qid INTEGER NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS meta (queue TEXT PRIMARY KEY, next_idx INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS groups (
    queue TEXT NOT NULL, gid TEXT NOT NULL, start INTEGER NOT NULL, tags TEXT NOT NULL,
    PRIMARY KEY (queue, gid));
CREATE TABLE IF NOT EXISTS acks (
    queue TEXT NOT NULL, gid TEXT NOT NULL, idx INTEGER NOT NULL, PRIMARY KEY (queue, gid, idx));
CREATE TABLE IF NOT EXISTS floors (queue TEXT PRIMARY KEY, floor INTEGER NOT NULL);
"""


def _tombstones(c: sqlite3.Connection, qid: int) -> None:
    """A queue's tombstone table (idempotent: also adds it to a database written before
    tombstones existed, and drops the per-record trigger of a development version)."""
    c.execute(
        f"CREATE TABLE IF NOT EXISTS t_{qid} "
        "(seq INTEGER PRIMARY KEY, n INTEGER NOT NULL, items TEXT NOT NULL)"
    )
    c.execute(f"DROP TRIGGER IF EXISTS r_{qid}_gone")


_INSERT = "INSERT INTO {} (idx, rid, tags, data) VALUES (?, ?, ?, ?)"
_SET_FLOOR = (
    "INSERT INTO floors (queue, floor) VALUES (?, ?) ON CONFLICT(queue) DO UPDATE SET floor = excluded.floor"
)


def _runs(idxs: list[int]) -> list[tuple[int, int]]:
    """Sorted, distinct indexes as inclusive (low, high) runs of consecutive values."""
    runs: list[tuple[int, int]] = []
    for i in sorted(idxs):
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        elif not runs or i != runs[-1][1]:
            runs.append((i, i))
    return runs


class SqliteBackend(GroupCommit):
    name = "sqlite"
    shared = False
    reads_back = True

    def __init__(self, path: str, fsync: str = "normal", writer: str | None = None) -> None:
        if fsync not in ("normal", "always"):
            raise ValueError("fsync must be 'normal' or 'always'")
        # The group commit's writer (sqlite_commit): the loop's own unless commits fsync.
        writer = writer or os.environ.get("EASGW_QUEUE_WRITER") or ("thread" if fsync == "always" else "loop")
        if writer not in ("loop", "thread"):
            raise ValueError("writer must be 'loop' or 'thread'")
        self.writer = writer
        self.path = path
        self.fsync = fsync
        self._qids: dict[str, int] = {}
        # Queues whose tables no write has created yet: every write to one creates them
        # (idempotently) until one succeeds, so a refused first write leaves no queue without
        # its table.
        self._uncreated: set[str] = set()
        self._reserved: dict[str, int] = {}
        self._acked: set[str] = set()
        self._removals: dict[str, int] = {}  # removals since the last tombstone prune
        # Per queue: the floor as written (or as the transaction under way writes it), kept by
        # the thread running the ops; and the highest index any of its tables may hold,
        # raised when a put is submitted, before its rows can exist.
        self._floors: dict[str, int] = {}
        self._tops: dict[str, int] = {}
        self._ckpt_stop = threading.Event()
        self._ckpt_thread: threading.Thread | None = None
        if path != ":memory:":
            private_file(path)  # 0600 in a 0700 directory, before SQLite opens it
        super().__init__(self._open(), writer)
        self._reader = PayloadReader(path, self._conn)

    def _open(self) -> sqlite3.Connection:
        # A statement per ring table and form: more than the default cache of 128 holds.
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, cached_statements=1024
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if self.fsync == 'always' else 'NORMAL'}")
        conn.execute("PRAGMA busy_timeout=5000")
        # Removed bytes are zeroed only where that costs no page write of its own (many builds
        # zero every freed page: a quarter more time and far more WAL per removal). File: 0600.
        conn.execute("PRAGMA secure_delete=FAST")
        if self.writer == "loop":
            # Checkpoints fsync; they run on a background connection instead of inside a commit.
            conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.executescript(_SCHEMA)
        qids = [int(qid) for (qid,) in conn.execute("SELECT qid FROM qmap")]
        if qids:
            conn.execute("BEGIN IMMEDIATE")
            for qid in qids:
                _tombstones(conn, qid)
                layout.migrate(conn, qid)
            conn.execute("COMMIT")
        return conn

    # ------------------------------------------------------------------ lifecycle
    def recover(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}

        def q(name: str) -> dict[str, Any]:
            return out.setdefault(
                name, {"next_idx": 1, "records": [], "groups": [], "acks": [], "removed": []}
            )

        c = self._conn
        for name, nxt in c.execute("SELECT queue, next_idx FROM meta"):
            q(name)["next_idx"] = nxt
            self._reserved[name] = nxt
        floors = dict(c.execute("SELECT queue, floor FROM floors").fetchall())
        for name, qid in c.execute("SELECT queue, qid FROM qmap").fetchall():
            self._qids[name] = qid
            recs = q(name)["records"]
            floor = floors.get(name, 0)
            self._floors[name] = floor
            for t in layout.tables(qid):
                # Metadata only: the payloads stay on disk until delivered (``read``). Rows
                # below the floor are records removed already.
                sql = f"SELECT idx, rid, tags, length(data) FROM {t} WHERE idx >= ?"  # noqa: S608 (s_<int>_<int>)
                for idx, rid, tags, size in c.execute(sql, (floor,)):
                    recs.append((idx, rid, json.loads(tags), None, size))
            recs.sort(key=itemgetter(0))
            # Every row left below the floor is below it: no table holds more than this.
            self._tops[name] = max(recs[-1][0] if recs else 0, floor - 1)
            q(name)["next_idx"] = max(q(name)["next_idx"], floor)
            if recs:
                q(name)["next_idx"] = max(q(name)["next_idx"], recs[-1][0] + 1)
            q(name)["removed"] = self._recent_tombstones(int(qid))
        for name, gid, start, tags in c.execute("SELECT queue, gid, start, tags FROM groups"):
            q(name)["groups"].append((gid, start, json.loads(tags)))
        for name, gid, idx in c.execute("SELECT queue, gid, idx FROM acks"):
            q(name)["acks"].append((gid, idx))
            self._acked.add(name)
        return out

    def read(self, queue: str, idx: int) -> bytes | None:
        """One record's payload, read back from disk (None if it is not there)."""
        return self._reader.read(self._qids.get(queue), idx)

    def free_bytes(self) -> int | None:
        return self._reader.free_bytes()

    def _recent_tombstones(self, qid: int) -> list[tuple[int, str]]:
        """The newest RECENT_LIMIT tombstones of a queue, oldest first (removal order)."""
        rows: list[list[list[Any]]] = []
        count = 0
        sql = f"SELECT items FROM t_{qid} ORDER BY seq DESC"  # noqa: S608 (t_<int>)
        for (items,) in self._conn.execute(sql):
            pairs = json.loads(items)
            rows.append(pairs)
            count += len(pairs)
            if count >= RECENT_LIMIT:
                break
        flat = [(int(idx), str(rid)) for pairs in reversed(rows) for idx, rid in pairs]
        return flat[-RECENT_LIMIT:]

    def _qid(self, queue: str, setup: list[Op]) -> int:
        """The queue's id; ``setup`` gets the op creating its tables while no write has."""
        qid = self._qids.get(queue)
        if qid is None:
            qid = max(self._qids.values(), default=0) + 1
            self._qids[queue] = qid
            self._uncreated.add(queue)
        if queue in self._uncreated:

            def create(c: sqlite3.Connection, queue: str = queue, qid: int = qid) -> None:
                c.execute("INSERT OR IGNORE INTO qmap (queue, qid) VALUES (?, ?)", (queue, qid))
                layout.create(c, qid)
                _tombstones(c, qid)

            setup.append(create)
        return qid

    def _created(self, queue: str, dur: Written) -> Written:
        """A write that creates the queue's tables was submitted: later ones need not, once it succeeded."""
        if dur is None:
            self._uncreated.discard(queue)
        else:
            # (A refused or cancelled write leaves them to the next one.)
            dur.add_done_callback(lambda f: f.cancelled() or f.exception() or self._uncreated.discard(queue))
        return dur

    def final_indexes(self, next_idx: dict[str, int]) -> None:
        """On a clean stop: record the exact next index of every queue (no reservation gap)."""
        if not next_idx:
            return

        def op(c: sqlite3.Connection) -> None:
            c.executemany(
                "INSERT INTO meta (queue, next_idx) VALUES (?, ?) "
                "ON CONFLICT(queue) DO UPDATE SET next_idx = excluded.next_idx",
                list(next_idx.items()),
            )

        self._execute(self._conn, [(op, None)])

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if self.writer == "thread":
            self._thread = threading.Thread(target=self._run, name="queue-sqlite-writer", daemon=True)
            self._thread.start()
        elif self.path != ":memory:":
            self._ckpt_thread = threading.Thread(
                target=self._checkpointer, name="queue-sqlite-ckpt", daemon=True
            )
            self._ckpt_thread.start()

    def _checkpointer(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=1000")
        try:
            while not self._ckpt_stop.wait(CHECKPOINT_INTERVAL_S):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:
                    log.debug("queue checkpoint skipped: %s", exc)
        finally:
            conn.close()

    async def aclose(self, next_idx: dict[str, int] | None = None) -> None:
        # The last commit and the checkpoint thread's end block: not on the event loop.
        await asyncio.to_thread(self.close, next_idx)

    def close(self, next_idx: dict[str, int] | None = None) -> None:
        if self._pending:
            self._flush()
        if self._ckpt_thread is not None:
            self._ckpt_stop.set()
            self._ckpt_thread.join(timeout=10)
            self._ckpt_thread = None
        if self._thread is not None:
            self._ops.put(None)
            self._thread.join(timeout=10)
            self._thread = None
        if next_idx:
            self.final_indexes(next_idx)
        self._reader.close()
        try:
            self._conn.close()
        except sqlite3.Error:
            pass

    # ------------------------------------------------------------------ journal ops
    def put(self, queue: str, records: list[Record], next_idx: int) -> Written:
        setup: list[Op] = []
        qid = self._qid(queue, setup)
        reserve: int | None = None
        if next_idx > self._reserved.get(queue, 0):
            reserve = next_idx + INDEX_RESERVE
            self._reserved[queue] = reserve
        # Before the rows exist: a removal run after this put may empty their table only if
        # it knows of them (a failed put leaves this too high, which is safe).
        self._tops[queue] = max(self._tops.get(queue, 0), records[-1].idx)
        if len(records) == 1 and not setup and reserve is None:
            r = records[0]
            sql = _INSERT.format(layout.table(qid, r.idx))
            row = (r.idx, r.rid, json.dumps(r.tags), r.data)
            return self._submit(lambda c: c.execute(sql, row), single=True)  # the common case, kept lean
        by_table: dict[str, list[tuple[int, str, str, bytes | None]]] = {}
        for r in records:
            row = (r.idx, r.rid, json.dumps(r.tags), r.data)
            by_table.setdefault(layout.table(qid, r.idx), []).append(row)

        def op(c: sqlite3.Connection) -> None:
            for s in setup:
                s(c)
            for name, rows in by_table.items():
                c.executemany(_INSERT.format(name), rows)
            if reserve is not None:
                c.execute(
                    "INSERT INTO meta (queue, next_idx) VALUES (?, ?) "
                    "ON CONFLICT(queue) DO UPDATE SET next_idx = max(next_idx, excluded.next_idx)",
                    (queue, reserve),
                )

        dur = self._submit(op)
        return self._created(queue, dur) if setup else dur

    def delete(
        self, queue: str, idxs: list[int], rids: list[str] | None = None, floor: int = 0, size: int = -1
    ) -> Written:
        """Remove records and leave their tombstones (``rids``: their request ids, in the
        order of ``idxs``) in the same transaction; runs of indexes are ranges already.

        Records below ``floor`` keep their rows when they are small (``size``, their
        payload bytes): the floor, written in the same transaction, removes them, and their
        table is emptied whole once the floor passes the end of their segment
        (``sqlite_layout``). The floor is only written while every refused write has been
        undone in memory: ``floor`` comes from the queue's memory, which a refused removal
        not undone yet overstates."""
        setup: list[Op] = []
        qid = self._qid(queue, setup)
        acked = queue in self._acked
        runs = _runs(idxs)
        removals = self._removals.get(queue, 0) + len(idxs)
        prune = removals >= PRUNE_EVERY
        self._removals[queue] = 0 if prune else removals
        tomb = f"t_{qid}"
        stone = (len(idxs), json.dumps(list(zip(idxs, rids, strict=True)))) if rids else None
        add_stone = f"INSERT INTO {tomb} (n, items) VALUES (?, ?)"  # noqa: S608 (t_<int>)
        defer = layout.deferrable(len(idxs), size)
        settled = self._settled

        def op(c: sqlite3.Connection) -> None:
            for s in setup:
                s(c)
            old = self._floors.get(queue, 0)
            new = floor if floor > old and self.errors == settled else old
            keep_below = new if defer else old  # rows below it need no DELETE of their own
            for name, lo, hi in layout.by_table(qid, runs):
                lo = max(lo, keep_below)
                if lo == hi:
                    c.execute(f"DELETE FROM {name} WHERE idx = ?", (lo,))  # noqa: S608 (s_<int>_<int>)
                elif lo < hi:
                    c.execute(f"DELETE FROM {name} WHERE idx BETWEEN ? AND ?", (lo, hi))  # noqa: S608
            if new > old:
                for sql, args in layout.clear(qid, old, new, self._tops.get(queue, 0)):
                    c.execute(sql, args)
                c.execute(_SET_FLOOR, (queue, new))
                self._floors[queue] = new
                self._on_rollback(lambda: self._floors.__setitem__(queue, old))
            if stone is not None:
                c.execute(add_stone, stone)
            if acked:
                c.executemany("DELETE FROM acks WHERE queue = ? AND idx = ?", [(queue, i) for i in idxs])
            if prune:  # keep the rows holding the newest RECENT_LIMIT tombstones
                c.execute(
                    f"DELETE FROM {tomb} WHERE seq < (SELECT seq FROM (SELECT seq, "  # noqa: S608 (t_<int>)
                    "sum(n) OVER (ORDER BY seq DESC) AS newer FROM "
                    f"{tomb}) WHERE newer >= ? ORDER BY seq DESC LIMIT 1)",
                    (RECENT_LIMIT,),
                )

        dur = self._submit(op)
        return self._created(queue, dur) if setup else dur

    def ack(self, queue: str, gid: str, idxs: list[int]) -> Written:
        rows = [(queue, gid, i) for i in idxs]
        self._acked.add(queue)

        def op(c: sqlite3.Connection) -> None:
            c.executemany("INSERT OR IGNORE INTO acks (queue, gid, idx) VALUES (?, ?, ?)", rows)

        return self._submit(op)

    def add_group(self, queue: str, gid: str, start: int, tags: dict[str, str]) -> Written:
        """Register a group, or record its new tag filter (its start never changes)."""
        row = (queue, gid, start, json.dumps(tags))

        def op(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT INTO groups (queue, gid, start, tags) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(queue, gid) DO UPDATE SET tags = excluded.tags",
                row,
            )

        return self._submit(op)

    def drop_group(self, queue: str, gid: str) -> Written:
        """Forget a group: its registration and what it committed."""
        row = (queue, gid)

        def op(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM groups WHERE queue = ? AND gid = ?", row)
            c.execute("DELETE FROM acks WHERE queue = ? AND gid = ?", row)

        return self._submit(op)
