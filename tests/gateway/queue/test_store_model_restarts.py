"""The reference-model test over the SQLite store, restarted at random.

``QueueMachine``'s steps run against a real SQLite file (written synchronously, as the
store writes when no event loop drives it), and Hypothesis restarts the store between
them: cleanly, or as after a crash (the connection dropped without its final write).
What the queue journals must come back exactly: records and their payloads, indexes
never used again, groups with their filters and what they committed, the memory of
removed records. What it does not journal goes as documented: connections are gone,
every record a group has not committed is delivered again from the group's start, and
any group may commit a recovered record.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from gateway.config import QueueConfig
from gateway.queue.sqlite import SqliteBackend
from gateway.queue.store import Queue
from tests.gateway.queue.test_store_model import QueueMachine


class RestartingMachine(QueueMachine):
    @initialize()
    def setup(self) -> None:
        super().setup()
        self.dir = tempfile.mkdtemp(prefix="queue-model-")
        self.path = str(Path(self.dir) / "queue.db")
        self.q = self._open()

    def _open(self) -> Queue:
        self.backend = SqliteBackend(self.path)
        q = Queue("q", QueueConfig(max_length=50, max_window=8), self.backend, grace_s=0)
        q.load(self.backend.recover().get("q", {}))
        return q

    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        recent = dict(self.q.recent)
        if clean:
            self.backend.close({"q": self.q.next_idx})
        else:
            self.backend._ckpt_stop.set()  # a crash: nothing more is written
            self.backend._conn.close()
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
                self.backend.close()
                shutil.rmtree(self.dir, ignore_errors=True)


# More runs than the base machine: the failures this finds need several groups and steps.
RestartingMachine.TestCase.settings = settings(QueueMachine.TestCase.settings, max_examples=500)
TestQueueModelWithRestarts = RestartingMachine.TestCase
