"""Queue semantics as a pure in-memory state machine over a durable backend.

No I/O and no event loop here: every method runs to completion synchronously and
returns its result plus, where something must reach the disk first, a
``Durable`` handle (an awaitable, or None when already durable) that the HTTP
layer awaits before answering. The backend journals the changes; on start the
state is rebuilt from what the backend recovers.

Model (per queue):

* records: index -> Record, indexes allocated from ``next_idx`` (starts at 1, never
  reused). A put becomes *visible* (gettable, deliverable) only once durable, and
  puts become visible in index order.
* groups (the gid header): a ``cursor`` (next never-delivered index), a heap of
  ``returned`` indexes (delivered to a consumer that left), ``pending``
  (index -> uid) and ``committed`` (live indexes this group already committed,
  only non-empty while another group still needs the record). Groups are created
  by a watch only (never by a commit or a get).
* consumers (uid within a group): a window, auto_commit, a tag filter and the
  indexes outstanding at it. A record is outstanding at one consumer per group.
  The connected consumers of a group share one tag filter (the group's); a watch
  with other tags while none is connected changes the group's filter, and the
  group then scans its records again from its start, so a record an old filter
  skipped is delivered once a filter matches it.
* A commit acknowledges for the caller's group; the record is deleted once every
  group it is relevant to (start <= index, tag filter matches) has committed it.
  A commit from a gid that has no group acknowledges outside any group: it deletes
  a record that no group still needs and is refused (404) for one a group needs.
* removed records (committed, deleted, truncated, read by a get with auto_delete)
  are remembered, the last ``RECENT_LIMIT`` of them, by index and request id: a
  commit of such an index is OK (idempotent) and a put with such a request id
  returns the old index and stores nothing. The backend keeps this memory across
  restarts (sqlite.py: the tombstones of one removal in one row, written in the same
  transaction as the removal).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gateway.queue.backend import Backend, MemoryBackend
from gateway.queue.groups import ConsumerGroups
from gateway.queue.records import MAX_GET_LENGTH, RECENT_LIMIT, Consumer, Durable, QueueError, Record
from gateway.queue.retention import make_room

__all__ = [
    "MAX_GET_LENGTH",
    "RECENT_LIMIT",
    "Backend",
    "Consumer",
    "Durable",
    "MemoryBackend",
    "Queue",
    "QueueError",
    "Record",
]


class Queue(ConsumerGroups):
    """One queue's state; all methods are synchronous and never block.

    The record log (``RecordLog``) and its consumer groups (``ConsumerGroups``) live in
    their own modules; this class adds what reports on both: search, attributes, figures."""

    def _make_room(self) -> bool:
        return make_room(self)

    def search(self, gid: str, idx: int) -> dict[str, Any] | None:
        rec = self.records.get(idx)
        if rec is None:
            return None
        g = self.groups.get(gid)
        if g is None:
            ahead = sum(1 for i in self.records if i < idx)
            return {"ConsumerId": "", "IsPending": False, "WaitCount": ahead}
        uid = g.pending.get(idx)
        if uid is not None:
            return {"ConsumerId": f"{gid}.{uid}", "IsPending": True, "WaitCount": 0}
        returned = set(g.returned)
        ahead = sum(
            1
            for i, r in self.records.items()
            if i < idx
            and i not in g.pending
            and i not in g.committed
            and g.relevant(r)
            and (i >= g.cursor or i in returned)
        )
        return {"ConsumerId": "", "IsPending": False, "WaitCount": ahead}

    def attributes(self, header_names: Mapping[str, str], backend_name: str) -> dict[str, str]:
        now = time.monotonic()
        a: dict[str, str] = {
            "meta.name": self.name,
            "meta.backend": backend_name,
            "meta.state": "Normal",
            "meta.maxPayloadBytes": str(self.cfg.max_payload_bytes),
            "meta.maxWindow": str(self.cfg.max_window),
            "meta.header.user": header_names["user"],
            "meta.header.group": header_names["group"],
            "meta.header.priority": header_names["priority"],
            "stream.length": str(self.length),
            "stream.approxMaxLength": str(self.cfg.max_length),
            "stream.maxLength": str(self.cfg.max_length),
            "stream.lastEntry": str(self.last_entry()),
            "stream.firstEntry": str(self.first_entry()),
            "stream.nextIndex": str(self.next_idx),
        }
        consumers: list[Consumer] = [c for g in self.groups.values() for c in g.consumers.values()]
        a["consumers.stats.total"] = str(len(consumers))
        a["consumers.status.total"] = str(len(consumers))
        a["consumers.stats.connected"] = str(sum(1 for c in consumers if c.connected))
        for i, c in enumerate(consumers):
            status = "Running" if c.connected else "Leaving"
            slots = max(0, c.room) if not c.auto_commit else c.window
            a[f"consumers.list.[{i}]"] = (
                f"Id: {c.gid}.{c.uid}, Index: {min(c.pending, default=0)}, Pending: {len(c.pending)}, "
                f"Status: {status}, Idle: {now - c.last_seen:.3f}s, Window: {c.window}, Slots: {slots}, "
                f"AutoCommit: {str(c.auto_commit).lower()}" + (f", Tags: tags{c.tags}" if c.tags else "")
            )
        a["groups.stats.total"] = str(len(self.groups))
        for i, g in enumerate(self.groups.values()):
            a[f"groups.list.[{i}]"] = (
                f"Id: {g.gid}, Index: {g.cursor}, Pending: {len(g.pending)}, "
                f"Returned: {len(g.returned)}, Consumers: {len(g.consumers)}"
            )
        return a

    def snapshot(self) -> dict[str, Any]:
        consumers = [c for g in self.groups.values() for c in g.consumers.values()]
        return {
            "length": self.length,
            "consumers": sum(1 for c in consumers if c.connected),
            "pending": sum(len(g.pending) for g in self.groups.values()),
            "groups": len(self.groups),
            "first_entry": self.first_entry(),
            "last_entry": self.last_entry(),
            "max_length": self.cfg.max_length,
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "memory_bytes": self.cached_bytes,
            "puts_total": self.puts_total,
            "commits_total": self.commits_total,
            "redeliveries_total": self.redeliveries_total,
        }
