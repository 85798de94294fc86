"""Asynchronous inference: the results of finished records written to the sink, their inputs
committed, many records per store call.

The dispatcher (dispatcher.py) hands each record over here once its worker answered and goes
on feeding the workers at once. The finisher takes everything that gathered meanwhile and

1. writes the results to the sink in one put of many records (``Queue.put_many``: one
   journal write, each result under its input's request id, so a record whose result is
   there already, or was consumed recently, gets no second one);
2. waits until that write is durable, and only then
3. commits the inputs in one commit (one journal write; contiguous indexes are removed as
   a range).

A record at a time cost two journal writes, two handles and two wake-ups per record, and its
worker slot stayed taken until both were durable. A crash between 1 and 3 leaves the inputs
uncommitted: they are delivered again, the work repeats and the sink takes no second result.
A store failure is retried with backoff (a record is never dropped, nor stranded at the
dispatcher); while the sink is full, the results that did not fit wait for room and their
inputs stay uncommitted.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from eas_sdk._core.constants import TAG_STATUS
from gateway.queue.records import Durable, QueueError, every_durable
from gateway.queue.store import Queue

log = logging.getLogger("gateway.dispatcher")

DISPATCH_GROUP = "eas"
SINK_FULL_POLL_S = 0.05
# Records per store call: bounds one transaction (and one undo) whatever gathered.
MAX_FINISH_BATCH = 1024


@dataclass(slots=True)
class Finished:
    """One input record whose worker answered: its result, not yet in the sink."""

    idx: int  # the input record's index
    rid: str  # its request id, the result's too
    tags: dict[str, str] | None  # the result's tags; None: no result (a 200 with an empty body)
    body: bytes
    status: int


@dataclass
class FinishStats:
    """What the dispatcher's figures count of finished records."""

    results_total: int = 0
    errors_total: int = 0
    empty_total: int = 0
    sink_full_waits: int = 0


class Finisher:
    """Writes finished records' results to the sink and commits their inputs, in batches."""

    def __init__(self, name: str, input_q: Queue, sink_q: Queue, stats: FinishStats) -> None:
        self.name = name
        self.input_q = input_q
        self.sink_q = sink_q
        self.stats = stats
        self._todo: list[Finished] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.busy = 0  # records handed over and not yet committed
        self.unwritten = 0  # results among them (they will need room in the sink)

    def add(self, f: Finished) -> None:
        self._todo.append(f)
        self.busy += 1
        if f.tags is not None:
            self.unwritten += 1
        self._idle.clear()
        self._wake.set()

    async def drained(self) -> None:
        """Return once every record handed over is committed."""
        await self._idle.wait()

    async def run(self) -> None:
        while True:
            if not self._todo:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = self._todo[:MAX_FINISH_BATCH]
            del self._todo[:MAX_FINISH_BATCH]
            await self._finish(batch)

    async def _finish(self, batch: list[Finished]) -> None:
        """Write and commit ``batch`` until done: store failures are retried, results that find
        the sink full wait for room (the others are committed meanwhile)."""
        todo = batch
        delay = 0.1
        while todo:
            try:
                written, waiting = await self._write(todo)
                await self._commit(written)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The whole batch again: results written already are found by request id.
                log.error(
                    "dispatcher %s: writing %d result(s) failed (%r); retrying", self.name, len(todo), exc
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._count(written)
            todo = waiting
            if todo:
                self.stats.sink_full_waits += 1
                await asyncio.sleep(SINK_FULL_POLL_S)

    async def _write(self, todo: list[Finished]) -> tuple[list[Finished], list[Finished]]:
        """Put the batch's results in the sink, durably -> (done, waiting for room in the sink)."""
        pending = [f for f in todo if f.tags is not None]
        waiting: list[Finished] = []
        durs: list[Durable] = []
        while pending:
            answers, dur = self.sink_q.put_many([(f.body, f.tags or {}, f.rid) for f in pending])
            durs.append(dur)
            refused: list[Finished] = []
            for f, answer in zip(pending, answers, strict=True):
                if not isinstance(answer, QueueError):
                    continue
                if answer.status == 429:  # sink full: the input stays uncommitted until there is room
                    waiting.append(f)
                    continue
                # The reply itself cannot be stored (too large): store why instead.
                f.status = answer.status
                f.tags = {**(f.tags or {}), TAG_STATUS: str(answer.status)}
                f.body = json.dumps({"error": answer.message}).encode()
                refused.append(f)
            pending = refused
        dur = every_durable(durs)
        if dur is not None:
            await dur
        if not waiting:
            return todo, []
        held = {id(f) for f in waiting}
        return [f for f in todo if id(f) not in held], waiting

    async def _commit(self, done: list[Finished]) -> None:
        """Commit the inputs of ``done``, whose results are durable in the sink."""
        if not done:
            return
        idxs = [f.idx for f in done]
        try:
            dur = self.input_q.commit(DISPATCH_GROUP, idxs)
        except QueueError:
            # One of them left the queue meanwhile and is forgotten already: the others alone.
            durs: list[Durable] = []
            for idx in idxs:
                try:
                    durs.append(self.input_q.commit(DISPATCH_GROUP, [idx]))
                except QueueError as exc:
                    log.warning("dispatcher %s: input %d not committed: %s", self.name, idx, exc.message)
            dur = every_durable(durs)
        if dur is not None:
            await dur

    def _count(self, done: list[Finished]) -> None:
        s = self.stats
        for f in done:
            if f.tags is None:
                s.empty_total += 1
                continue
            s.results_total += 1
            self.unwritten -= 1
            if f.status >= 400:
                s.errors_total += 1
        self.busy -= len(done)
        if self.busy == 0:
            self._idle.set()


__all__ = ["DISPATCH_GROUP", "MAX_FINISH_BATCH", "SINK_FULL_POLL_S", "FinishStats", "Finished", "Finisher"]
