"""The SQLite store's ring of record tables: which rows a removal deletes, when a table is
emptied whole, what the floor hides from recovery, and how a refused write leaves it.

Most tests shrink the ring (segments of 4 indexes, 3 tables) so that a few records cross
every boundary; the layout's functions read its constants when called."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.queue import sqlite_layout as layout
from gateway.queue.records import Record
from gateway.queue.sqlite import SqliteBackend


@pytest.fixture
def small_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "SEGMENT", 4)
    monkeypatch.setattr(layout, "RING", 3)


def _records(idxs: range, size: int = 10) -> list[Record]:
    return [Record(i, f"rid-{i}", {"k": str(i)}, bytes([i % 256]) * size) for i in idxs]


def _rows(path: Path, name: str) -> list[int]:
    with sqlite3.connect(path) as conn:
        got = [idx for (idx,) in conn.execute(f"SELECT idx FROM {name} ORDER BY idx")]  # noqa: S608
    conn.close()
    return got


def _all_rows(path: Path) -> list[int]:
    return sorted(i for name in layout.tables(1) for i in _rows(path, name))


def _recovered(path: Path) -> list[int]:
    b = SqliteBackend(str(path))
    try:
        return [rec[0] for rec in b.recover().get("q", {}).get("records", [])]
    finally:
        b.close()


def _remove(b: SqliteBackend, idxs: list[int], floor: int, size: int = 10) -> None:
    b.delete("q", idxs, [f"rid-{i}" for i in idxs], floor, size * len(idxs))


# ----------------------------------------------------------------------------- the layout


def test_consecutive_segments_go_to_the_tables_in_turn(small_ring: None) -> None:
    assert [layout.table(7, i) for i in (0, 3, 4, 8, 11, 12, 13)] == [
        "s_7_0",
        "s_7_0",
        "s_7_1",
        "s_7_2",
        "s_7_2",
        "s_7_0",
        "s_7_0",
    ]
    assert layout.tables(7) == ["s_7_0", "s_7_1", "s_7_2"]


def test_runs_are_cut_where_segments_end(small_ring: None) -> None:
    assert layout.by_table(1, [(2, 9), (13, 13)]) == [
        ("s_1_0", 2, 3),
        ("s_1_1", 4, 7),
        ("s_1_2", 8, 9),
        ("s_1_0", 13, 13),
    ]


def test_a_table_is_emptied_whole_only_while_it_holds_no_later_segment(small_ring: None) -> None:
    # Floor 1 -> 9: segments 0 and 1 are dead. The highest index written is 11 (segment 2).
    assert layout.clear(1, 1, 9, 11) == [("DELETE FROM s_1_0", ()), ("DELETE FROM s_1_1", ())]
    # Index 13 was written: segment 3 shares the table of segment 0, which keeps it.
    assert layout.clear(1, 1, 9, 13) == [
        ("DELETE FROM s_1_0 WHERE idx < ?", (4,)),
        ("DELETE FROM s_1_1", ()),
    ]
    # Within one segment, or below a floor already written: nothing to empty.
    assert layout.clear(1, 5, 7, 100) == []
    assert layout.clear(1, 9, 9, 100) == []
    # Past the whole ring at once: one statement per table, up to its last dead segment
    # (segments 0-5 dead, 30 written: only the third table holds no live segment).
    assert layout.clear(1, 0, 24, 30) == [
        ("DELETE FROM s_1_0 WHERE idx < ?", (16,)),
        ("DELETE FROM s_1_1 WHERE idx < ?", (20,)),
        ("DELETE FROM s_1_2", ()),
    ]


@settings(max_examples=300, deadline=None)
@given(
    segment=st.integers(1, 6),
    ring=st.integers(1, 5),
    old=st.integers(0, 60),
    step=st.integers(0, 60),
    ahead=st.integers(0, 60),
)
def test_emptying_tables_removes_every_passed_segment_and_nothing_at_or_above_the_floor(
    segment: int, ring: int, old: int, step: int, ahead: int
) -> None:
    """Against a model of the tables: rows from the old floor (the segment it is in, whole)
    up to ``top``, each in its table; after the statements no row of a wholly passed segment
    is left and every row at or above the new floor is still there."""
    new, top = old + step, old + step + ahead
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(layout, "SEGMENT", segment)
        mp.setattr(layout, "RING", ring)
        tables: dict[str, set[int]] = {}
        for i in range(old // segment * segment, top + 1):
            tables.setdefault(layout.table(1, i), set()).add(i)
        for sql, args in layout.clear(1, old, new, top):
            name = sql.split()[2]
            rows = tables.get(name, set())
            tables[name] = {i for i in rows if i >= args[0]} if args else set()
    left = set().union(*tables.values())
    assert not any(i < new // segment * segment for i in left)
    assert {i for i in range(new, top + 1)} <= left


@given(runs=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 12)), max_size=5))
def test_runs_cut_at_segment_ends_cover_the_same_indexes(runs: list[tuple[int, int]]) -> None:
    spans = [(lo, lo + n) for lo, n in runs]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(layout, "SEGMENT", 4)
        mp.setattr(layout, "RING", 3)
        pieces = layout.by_table(1, spans)
        for name, lo, hi in pieces:
            assert lo // 4 == hi // 4 and name == layout.table(1, lo)
    assert [i for _, lo, hi in pieces for i in range(lo, hi + 1)] == [
        i for lo, hi in spans for i in range(lo, hi + 1)
    ]


def test_only_small_records_keep_their_rows() -> None:
    assert layout.deferrable(10, 10 * layout.DEFERRED_RECORD_BYTES)
    assert not layout.deferrable(10, 10 * layout.DEFERRED_RECORD_BYTES + 1)
    assert not layout.deferrable(10, -1)  # size not known: delete the rows


# ----------------------------------------------------------------------------- the backend


def test_removals_from_the_front_free_whole_tables_and_stay_removed(small_ring: None, tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite3"
    b = SqliteBackend(str(path))
    b.put("q", _records(range(1, 11)), 11)
    _remove(b, [1, 2, 3, 4, 5], floor=6)
    b.close()
    # Segment 0 (1-3) is emptied whole; 4 and 5 keep their rows below the floor ...
    assert _rows(path, "s_1_0") == [] and _rows(path, "s_1_1") == [4, 5, 6, 7]
    # ... which hides them from recovery.
    assert _recovered(path) == [6, 7, 8, 9, 10]
    b = SqliteBackend(str(path))
    b.recover()
    _remove(b, [6, 7], floor=8)  # the floor passes segment 1: its table is emptied
    b.close()
    assert _all_rows(path) == [8, 9, 10] and _recovered(path) == [8, 9, 10]


def test_a_backlog_longer_than_the_ring_keeps_its_later_segments(small_ring: None, tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite3"
    b = SqliteBackend(str(path))
    b.put("q", _records(range(1, 21)), 21)  # segments 0-5: segment 3 shares segment 0's table
    _remove(b, [1, 2, 3], floor=4)
    b.close()
    assert _rows(path, "s_1_0") == [12, 13, 14, 15]
    assert _recovered(path) == list(range(4, 21))


def test_removals_above_the_floor_and_of_large_records_delete_rows(small_ring: None, tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite3"
    b = SqliteBackend(str(path))
    b.put("q", _records(range(1, 11)), 11)
    _remove(b, [6, 9], floor=1)  # out of order: records below them are still in the queue
    assert _all_rows(path) == [1, 2, 3, 4, 5, 7, 8, 10]
    _remove(b, [1, 2], floor=3, size=layout.DEFERRED_RECORD_BYTES + 1)
    assert _all_rows(path) == [3, 4, 5, 7, 8, 10]
    b.close()
    assert _recovered(path) == [3, 4, 5, 7, 8, 10]


def test_a_refused_removal_writes_no_floor(small_ring: None, tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite3"
    b = SqliteBackend(str(path))
    b.put("q", _records(range(1, 11)), 11)
    b._conn.execute("PRAGMA query_only=1")  # a read-only disk
    with pytest.raises(sqlite3.OperationalError):
        _remove(b, [1, 2, 3, 4, 5], floor=6)
    b._conn.execute("PRAGMA query_only=0")
    assert b._floors.get("q", 0) == 0  # what the database holds, not what the refused write said
    _remove(b, [1], floor=2)  # the queue, undone in memory, sends the floor it has
    b.close()
    assert _recovered(path) == list(range(2, 11))


async def test_a_floor_goes_back_with_the_transaction_that_wrote_it(small_ring: None, tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite3"
    b = SqliteBackend(str(path))
    b.start(asyncio.get_running_loop())
    try:
        await b.put("q", _records(range(1, 11)), 11)  # type: ignore[misc]
        removal = b.delete("q", [1, 2, 3, 4, 5], [f"rid-{i}" for i in range(1, 6)], 6, 50)
        clash = b.put("q", _records(range(7, 8)), 11)  # index 7 is there: the transaction fails
        for dur in (removal, clash):
            with pytest.raises(Exception, match="write failed"):
                await dur  # type: ignore[misc]
        assert b._floors.get("q", 0) == 0
        await b.delete("q", [1], ["rid-1"], 2, 10)  # type: ignore[misc]
    finally:
        b.close()
    assert _recovered(path) == list(range(2, 11))


async def test_a_removal_sent_before_an_undo_writes_no_floor(small_ring: None, tmp_path: Path) -> None:
    """With the writer thread, a write fails in the thread and is undone in the loop later;
    a removal sent in between carries a floor from memory that still counts the refused
    removal's records as gone. It deletes its own rows instead of writing that floor."""
    path = tmp_path / "q.sqlite3"
    b = SqliteBackend(str(path), writer="thread")
    b.start(asyncio.get_running_loop())
    try:
        await b.put("q", _records(range(1, 11)), 11)  # type: ignore[misc]
        b._conn.execute("PRAGMA query_only=1")
        refused = b.delete("q", [1, 2, 3, 4, 5], [f"rid-{i}" for i in range(1, 6)], 6, 50)
        deadline = time.monotonic() + 5
        while b.errors == 0 and time.monotonic() < deadline:  # refused in the thread, not undone yet
            time.sleep(0.001)
        b._conn.execute("PRAGMA query_only=0")
        after = b.delete("q", [6, 7], ["rid-6", "rid-7"], 8, 20)
        with pytest.raises(Exception, match="write failed"):
            await refused  # type: ignore[misc]
        await after  # type: ignore[misc]
        assert b._floors.get("q", 0) == 0
    finally:
        b.close()
    assert _recovered(path) == [1, 2, 3, 4, 5, 8, 9, 10]


def test_a_store_of_one_table_per_queue_is_moved_into_the_ring(small_ring: None, tmp_path: Path) -> None:
    path = tmp_path / "q.sqlite3"
    b = SqliteBackend(str(path))
    b.put("q", _records(range(1, 15)), 15)
    b.close()
    with sqlite3.connect(path) as conn:  # as a version before the ring wrote it
        conn.execute("CREATE TABLE r_1 (idx INTEGER PRIMARY KEY, rid TEXT, tags TEXT, data BLOB)")
        for name in layout.tables(1):
            conn.execute(f"INSERT INTO r_1 SELECT * FROM {name}")  # noqa: S608
            conn.execute(f"DROP TABLE {name}")
        conn.execute("DROP TABLE floors")
    conn.close()
    assert _recovered(path) == list(range(1, 15))
    assert _rows(path, "s_1_0") == [1, 2, 3, 12, 13, 14] and _rows(path, "s_1_2") == [8, 9, 10, 11]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'r_1'").fetchone() is None
    conn.close()
    b = SqliteBackend(str(path))
    state = b.recover()["q"]
    assert state["records"][0][3] is None and b.read("q", 13) == bytes([13]) * 10
    b.close()
