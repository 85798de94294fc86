"""Where the SQLite store keeps a queue's records: a ring of tables by index segment.

Deleting rows one at a time rewrites every page they sat on: for a commit of a hundred
1 KiB records that is most of the transaction's time and of what it writes to the WAL.
Consumers mostly remove records from the front of a queue, where the queue's *floor*
(no record kept below it) moves up, so the store frees those without touching their rows:

* Index ``i`` of queue ``qid`` lives in table ``s_<qid>_<(i // SEGMENT) % RING>``: each
  run of ``SEGMENT`` consecutive indexes (a segment) in the next table of the ring.
* A removal below the floor deletes no row. The floor is written in the removal's own
  transaction (table ``floors``), and recovery reads only the rows at or above it.
* Once the floor passes the end of a segment, its table is emptied by one ``DELETE``
  without a ``WHERE``, which SQLite carries out by freeing the table's pages whole instead
  of rewriting them. A table that may also hold a later segment (a backlog of more than
  ``RING - 1`` segments) has the dead segment's rows deleted by range instead.
* Removals above the floor (out of order), and of records larger than
  ``DEFERRED_RECORD_BYTES`` on average, delete their rows at once. So the rows kept after
  their removal are those of one segment at most, of small records: at most
  ``SEGMENT * DEFERRED_RECORD_BYTES`` of disk per queue.

``SEGMENT`` and ``RING`` say where a record is on disk: a store written with other
values would need its rows moved, as ``create`` moves those of the one-table layout.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

SEGMENT = 1024
RING = 16
DEFERRED_RECORD_BYTES = 4096

_COLUMNS = "(idx INTEGER PRIMARY KEY, rid TEXT NOT NULL, tags TEXT NOT NULL, data BLOB NOT NULL)"


def _name(qid: int, k: int) -> str:
    return f"s_{int(qid)}_{k}"


def table(qid: int, idx: int) -> str:
    """The table holding index ``idx`` of queue ``qid``."""
    return _name(qid, (idx // SEGMENT) % RING)


def tables(qid: int) -> list[str]:
    return [_name(qid, k) for k in range(RING)]


def create(c: sqlite3.Connection, qid: int) -> None:
    """The queue's record tables (idempotent)."""
    for name in tables(qid):
        c.execute(f"CREATE TABLE IF NOT EXISTS {name} {_COLUMNS}")


def migrate(c: sqlite3.Connection, qid: int) -> None:
    """``create``, and the rows of a table of the layout before the ring (``r_<qid>``,
    every record of the queue in one table) moved into the ring."""
    create(c, qid)
    old = f"r_{int(qid)}"
    if c.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (old,)).fetchone():
        for k, name in enumerate(tables(qid)):
            c.execute(
                f"INSERT INTO {name} SELECT idx, rid, tags, data FROM {old} "  # noqa: S608 (s_<int>_<int>, r_<int>)
                "WHERE (idx / ?) % ? = ?",
                (SEGMENT, RING, k),
            )
        c.execute(f"DROP TABLE {old}")


def by_table(qid: int, runs: Iterable[tuple[int, int]]) -> list[tuple[str, int, int]]:
    """Inclusive runs of indexes, cut at segment ends -> (table, low, high)."""
    out: list[tuple[str, int, int]] = []
    for lo, hi in runs:
        while lo <= hi:
            end = min(hi, (lo // SEGMENT + 1) * SEGMENT - 1)
            out.append((table(qid, lo), lo, end))
            lo = end + 1
    return out


def clear(qid: int, old_floor: int, new_floor: int, top: int) -> list[tuple[str, tuple[int, ...]]]:
    """Statements that empty the segments wholly below ``new_floor`` and not wholly below
    ``old_floor``; ``top``: the highest index any table may hold. One statement per table."""
    last: dict[int, int] = {}  # ring position -> the highest newly dead segment there
    end = new_floor // SEGMENT
    for seg in range(max(old_floor // SEGMENT, end - RING), end):  # the last RING are enough
        last[seg % RING] = seg
    out: list[tuple[str, tuple[int, ...]]] = []
    for k, seg in sorted(last.items()):
        name = _name(qid, k)
        if top < (seg + RING) * SEGMENT:  # it holds no later segment: free it whole
            out.append((f"DELETE FROM {name}", ()))  # noqa: S608 (s_<int>_<int>)
        else:
            out.append((f"DELETE FROM {name} WHERE idx < ?", ((seg + 1) * SEGMENT,)))  # noqa: S608
    return out


def deferrable(count: int, size: int) -> bool:
    """Whether removed records this small (on average) may keep their rows until their
    segment is freed."""
    return 0 <= size <= count * DEFERRED_RECORD_BYTES
