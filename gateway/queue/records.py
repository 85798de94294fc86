"""The queue's data: records, consumers and consumer groups, refusals and durability handles.

Plain data with no behaviour beyond small predicates; the state machine that changes
them is ``store.Queue`` (records in ``recordlog.py``, groups in ``groups.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# The durability handles live in durable.py; named here too, where the data is.
from gateway.queue.durable import Durable, every_durable, last_durable

__all__ = [
    "AUTO_COMMIT_BYTES",
    "AUTO_COMMIT_SLICE",
    "MAX_GET_LENGTH",
    "RECENT_LIMIT",
    "Consumer",
    "Durable",
    "Group",
    "QueueError",
    "Record",
    "every_durable",
    "last_durable",
    "matches",
]

# Bounded memory of removed records (index -> request id, kept durable by the backend), so
# that a repeated commit stays idempotent and a retried put (same request id) returns the
# same index after its record was consumed, across restarts too.
RECENT_LIMIT = 100_000
MAX_GET_LENGTH = 10_000
# With auto_commit the window does not limit; records are handed out in slices this big,
# and of at most this many payload bytes (or one record): their payloads are read from disk
# before the hand-out commits (and deletes) them.
AUTO_COMMIT_SLICE = 256
AUTO_COMMIT_BYTES = 1024 * 1024


class QueueError(Exception):
    """A request the queue refuses; ``param`` names the offending parameter."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


@dataclass(slots=True)
class Record:
    """One record. ``data`` is None once the payload left memory (it is durable in the
    backend, read back on delivery: ``RecordLog.payload``); ``size`` is its length either way."""

    idx: int
    rid: str
    tags: dict[str, str]
    data: bytes | None
    fetched: bool = False  # returned by a get (a later commit is then legitimate)
    size: int = -1

    def __post_init__(self) -> None:
        if self.size < 0:
            self.size = len(self.data) if self.data is not None else 0


@dataclass(eq=False)
class Consumer:
    gid: str
    uid: str
    window: int
    auto_commit: bool
    tags: dict[str, str]
    conn: int  # connection generation; a stale connection's disconnect is ignored
    pending: dict[int, None] = field(default_factory=dict)  # outstanding, in delivery order
    resend: list[int] = field(default_factory=list)  # taken over from a previous connection
    connected: bool = True
    since: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    delivered: int = 0
    wake: Callable[[], None] | None = None
    # Last time the consumer moved: a delivery written to its socket, or one of its records
    # committed (ws.py closes a watcher that holds records without moving for watcher_idle_s).
    progress: float = field(default_factory=time.monotonic)
    # Records taken off this consumer by a commit or removal whose write is not durable yet:
    # they still count in its window (a refused write gives them back).
    releasing: int = 0

    @property
    def room(self) -> int:
        if self.auto_commit:
            return AUTO_COMMIT_SLICE
        return self.window - len(self.pending) - self.releasing


@dataclass(eq=False)
class Group:
    gid: str
    start: int
    tags: dict[str, str]
    cursor: int
    returned: list[int] = field(default_factory=list)  # heap
    pending: dict[int, str] = field(default_factory=dict)  # idx -> uid
    committed: set[int] = field(default_factory=set)
    consumers: dict[str, Consumer] = field(default_factory=dict)
    deliveries: dict[int, int] = field(default_factory=dict)  # idx -> delivery count (in memory)
    # When its last consumer left (creation or recovery before any): retention.py's idle time.
    last_seen: float = field(default_factory=time.monotonic)

    def relevant(self, rec: Record) -> bool:
        return rec.idx >= self.start and matches(self.tags, rec.tags)


def matches(want: Mapping[str, str], have: Mapping[str, str]) -> bool:
    for k, v in want.items():
        if have.get(k) != v:
            return False
    return True
