"""Group commit for the SQLite store: journal ops become transactions, and each op's
handle completes only after the COMMIT that holds it.

Two writers (``SqliteBackend`` picks one by its ``fsync`` setting):

* ``loop``: everything submitted during one event-loop iteration is one transaction,
  committed in the loop at the end of the iteration (a commit without fsync is a write()
  into the page cache: cheaper than two thread hand-offs).
* ``thread``: a writer thread takes every waiting op (up to ``MAX_BATCH``) per transaction;
  needed when every commit fsyncs.

Before an event loop drives it (offline use, tests) an op is its own transaction, written
synchronously.
"""

from __future__ import annotations

import asyncio
import logging
import queue as _stdqueue
import sqlite3
import threading
from collections.abc import Callable

from gateway.queue.backend import StorageError
from gateway.queue.durable import Write, Written

log = logging.getLogger("gateway.queue.sqlite")

MAX_BATCH = 1024

Op = Callable[[sqlite3.Connection], None]


class GroupCommit:
    """Runs ops on ``_conn`` in transactions; ``errors`` counts the refused ones and
    ``failure`` says why the last write failed, until one succeeds again."""

    def __init__(self, conn: sqlite3.Connection, writer: str) -> None:
        self.writer = writer
        self._conn = conn
        self._pending: list[tuple[Op, Write]] = []
        # The pending batch is one op of one statement: it runs as its own (autocommit)
        # transaction, without the BEGIN/COMMIT round trips through the statement cache.
        self._single = False
        self._flush_scheduled = False
        self._ops: _stdqueue.SimpleQueue[tuple[Op, Write] | None] = _stdqueue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # What the ops of the transaction under way changed outside the database.
        self._rollbacks: list[Callable[[], None]] = []
        # Refused transactions whose handles have completed, their undos run in the loop.
        self._settled = 0
        self.batches = 0
        self.ops = 0
        self.errors = 0
        self.failure: str | None = None

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
            err = self._execute(conn, batch)
            futs = [f for _, f in batch]
            try:
                loop.call_soon_threadsafe(self._complete, futs, err)
            except RuntimeError:  # loop closed during shutdown
                break

    def _submit(self, op: Op, single: bool = False) -> Written:
        if self._loop is None:
            # Not started (offline use, tests): write synchronously.
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                op(conn)
                conn.execute("COMMIT")
            except BaseException:
                self._rolled_back()
                raise
            finally:
                self._rollbacks.clear()
            return None
        # A Write: no caller can cancel it (durable.py), so every op submitted is answered
        # by ``_complete``, with the undos of a refused one run first.
        fut = Write(loop=self._loop)
        fut.add_done_callback(_retrieve)  # a failure nobody awaits is logged once, not warned about
        if self.writer == "thread":
            self._ops.put((op, fut))
            return fut
        self._single = single and not self._pending
        self._pending.append((op, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        """Loop writer: everything submitted during this loop iteration in one transaction."""
        self._flush_scheduled = False
        batch, self._pending = self._pending, []
        if not batch:
            return
        err = self._execute(self._conn, batch, self._single and len(batch) == 1)
        self._complete([f for _, f in batch], err)

    def _on_rollback(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` if the transaction under way fails (an op changed something besides
        the database that the rollback does not take back)."""
        self._rollbacks.append(undo)

    def _rolled_back(self) -> None:
        """The transaction under way failed: undo what its ops changed outside the database."""
        for undo in reversed(self._rollbacks):
            undo()

    def _complete(self, futs: list[Write], err: BaseException | None) -> None:
        """In the loop: a transaction ended. A refused one's changes are undone in memory
        (``Write.finish``) before its callers resume."""
        for f in futs:  # each its own exception: every waiter raises it with its own traceback
            f.finish(None if err is None else StorageError(f"queue storage write failed: {err}"))
        if err is not None:
            self._settled += 1  # its undos ran: the memory holds what the store holds again

    def _execute(
        self,
        conn: sqlite3.Connection,
        batch: list[tuple[Op, Write]] | list[tuple[Op, None]],
        single: bool = False,
    ) -> BaseException | None:
        err: BaseException | None = None
        try:
            if single:  # one statement: autocommit is one transaction, committed when it ends
                batch[0][0](conn)
            else:
                conn.execute("BEGIN IMMEDIATE")
                for op, _ in batch:
                    op(conn)
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            err = exc
            self._rolled_back()
            self.errors += 1
            self.failure = f"sqlite: {exc}"
            log.error("queue storage write failed: %s", exc)
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        else:
            self.failure = None
        self._rollbacks.clear()
        self.batches += 1
        self.ops += len(batch)
        return err


def _retrieve(f: asyncio.Future[None]) -> None:
    if not f.cancelled():
        f.exception()
