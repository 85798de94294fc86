"""The reference-model test over the real stores, restarted at random.

``QueueMachine``'s steps run against a real SQLite file (written synchronously, as the
store writes when no event loop drives it) and against a real redis-server (each write
waited for), and Hypothesis restarts the store between
them: cleanly, or as after a crash (the connection dropped without its final write).
What the queue journals must come back exactly: records and their payloads, indexes
never used again, groups with their filters and what they committed, the memory of
removed records. What it does not journal goes as documented: connections are gone,
every record a group has not committed is delivered again from the group's start, and
any group may commit a recovered record.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule, run_state_machine_as_test

from gateway.config import QueueConfig
from gateway.queue import sqlite_layout as layout
from gateway.queue.redis_backend import RedisBackend
from gateway.queue.sqlite import SqliteBackend
from gateway.queue.store import Queue
from tests.gateway.queue.test_store_model import QueueMachine
from tests.redis_server import RedisServer

# Hundreds of generated runs, each restarting a real store: a minute's work on a quiet
# machine and several on a busy one. The suite's 60-second limit guards against a hang,
# which a slow machine is not; this one still ends a run that hangs.
pytestmark = pytest.mark.timeout(600)


class RestartingMachine(QueueMachine):
    @initialize()
    def setup(self) -> None:
        super().setup()
        # A tiny ring of record tables, so that a run crosses its segments and wraps it.
        self.ring = (layout.SEGMENT, layout.RING)
        layout.SEGMENT, layout.RING = 2, 3
        self.dir = tempfile.mkdtemp(prefix="queue-model-")
        self.path = str(Path(self.dir) / "queue.db")
        self.q = self._open()

    def _open(self) -> Queue:
        self.backend = SqliteBackend(self.path)
        return self._queue(self.backend, self.backend.recover().get("q", {}))

    @staticmethod
    def _queue(backend: Any, state: dict[str, Any]) -> Queue:
        q = Queue("q", QueueConfig(max_length=50, max_window=8), backend, grace_s=0)
        q.load(state)
        return q

    def _stop(self, clean: bool) -> None:
        if clean:
            self.backend.close({"q": self.q.next_idx})
        else:
            self.backend._ckpt_stop.set()  # a crash: nothing more is written
            self.backend._conn.close()
            self.backend._reader.close()  # its own connection: 3.13 warns of one left to the GC

    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        recent = dict(self.q.recent)
        self._stop(clean)
        self.q = self._open()
        assert self.q.next_idx >= self.next_idx, "an index could be used again"
        assert dict(self.q.recent) == recent
        self.next_idx = self.q.next_idx
        self.recovered_below = self.next_idx
        self.conns.clear()
        self.last_fresh.clear()
        self.fetched.clear()
        for g in self.groups.values():
            g.outstanding.clear()
            g.delivered.clear()
            g.released.clear()

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            if hasattr(self, "backend"):
                self._stop(True)
                shutil.rmtree(self.dir, ignore_errors=True)
            if hasattr(self, "ring"):
                layout.SEGMENT, layout.RING = self.ring


# More runs than the base machine: the failures this finds need several groups and steps.
RestartingMachine.TestCase.settings = settings(QueueMachine.TestCase.settings, max_examples=500)
TestQueueModelWithRestarts = RestartingMachine.TestCase


class Waited:
    """A Redis backend whose every write is waited for before the store goes on (as the
    SQLite store writes when no event loop drives it): the model's steps stay synchronous."""

    def __init__(self, inner: RedisBackend, loop: asyncio.AbstractEventLoop) -> None:
        self.inner = inner
        self.loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _wait(self, dur: Any) -> None:
        if dur is not None:
            self.loop.run_until_complete(dur)

    def put(self, *args: Any) -> None:
        self._wait(self.inner.put(*args))

    def delete(self, *args: Any) -> None:
        self._wait(self.inner.delete(*args))

    def ack(self, *args: Any) -> None:
        self._wait(self.inner.ack(*args))

    def add_group(self, *args: Any) -> None:
        self._wait(self.inner.add_group(*args))

    def drop_group(self, *args: Any) -> None:
        self._wait(self.inner.drop_group(*args))


REDIS_DB = 5  # flushed before each run


class RedisRestartingMachine(RestartingMachine):
    """The same over the Redis backend: a crash drops the connection without the final write."""

    url = ""

    @initialize()
    def setup(self) -> None:
        self.loop = asyncio.new_event_loop()
        with redis.Redis.from_url(self.url) as c:
            c.flushdb()
        QueueMachine.setup(self)
        self.dir = ""
        self.q = self._open()

    def _open(self) -> Queue:
        backend = RedisBackend(self.url)
        state = self.loop.run_until_complete(backend.recover_async(["q"])).get("q", {})
        backend.start(self.loop)
        self.backend = Waited(backend, self.loop)  # type: ignore[assignment]
        return self._queue(self.backend, state)

    def _stop(self, clean: bool) -> None:
        inner = self.backend.inner  # type: ignore[attr-defined]
        if clean:
            self.loop.run_until_complete(inner.aclose({"q": self.q.next_idx}))
        else:
            self.loop.run_until_complete(inner.client.aclose())  # no final write of the indexes

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            self.loop.close()


def test_queue_model_on_redis_with_restarts(redis_server: RedisServer) -> None:
    class OnThisServer(RedisRestartingMachine):
        url = redis_server.url(REDIS_DB)

    run_state_machine_as_test(
        OnThisServer, settings=settings(QueueMachine.TestCase.settings, max_examples=150)
    )
