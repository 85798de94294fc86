"""Consumer groups listed and deleted, and the retention rules that keep an abandoned group
from pinning records forever (the state machine; across restarts: test_backend_conformance)."""

from __future__ import annotations

import logging
import time

import pytest

from gateway.config import QueueConfig
from gateway.queue import groups_admin, retention
from gateway.queue.store import MemoryBackend, Queue, QueueError


def _queue(**cfg: float) -> Queue:
    return Queue("q", QueueConfig(max_length=5, **cfg), MemoryBackend(), grace_s=0)  # type: ignore[arg-type]


def _fill(q: Queue, n: int, tags: dict[str, str] | None = None) -> list[int]:
    return [q.put(f"r{i}".encode(), dict(tags or {}), None)[0] for i in range(n)]


def _abandon(q: Queue, gid: str, *, tags: dict[str, str] | None = None, take: int = 0) -> None:
    """A watcher of group ``gid`` arrives, takes ``take`` records without committing, leaves."""
    c, _ = q.connect(gid, "u-" + gid, 0, 10, False, dict(tags or {}))
    q.take(c, take)
    q.disconnect(c)


def test_listing_shows_position_pending_lag_and_consumers() -> None:
    q = _queue()
    _fill(q, 4)
    live, _ = q.connect("live", "u1", 0, 2, False, {})
    q.take(live)
    q.commit("live", [1])  # deleted: no other group yet
    _abandon(q, "gone")
    info = {g["group"]: g for g in groups_admin.list_groups(q)}
    assert (info["live"]["cursor"], info["live"]["pending"], info["live"]["lag"]) == (3, 1, 3)
    assert (info["live"]["consumers"], info["live"]["idle_s"]) == (1, 0.0)
    assert (info["gone"]["pending"], info["gone"]["lag"], info["gone"]["consumers"]) == (0, 3, 0)
    assert info["gone"]["idle_s"] >= 0 and info["gone"]["last_seen"].endswith("Z")


def test_deleting_a_group_releases_only_what_it_alone_needed() -> None:
    q = _queue()
    _fill(q, 2, {"t": "a"})
    _fill(q, 2, {"t": "b"})  # 3, 4
    _abandon(q, "all")  # needs 1..4
    _abandon(q, "b", tags={"t": "b"})  # needs 3, 4
    n, _ = groups_admin.delete_group(q, "all")
    assert n == 2 and sorted(q.records) == [3, 4]  # 3 and 4 still owed to group b
    assert "all" not in q.groups
    assert q.commit("all", [1]) is None  # removed records stay idempotent to commit
    with pytest.raises(QueueError) as info:
        groups_admin.delete_group(q, "all")
    assert info.value.status == 404


def test_a_group_with_a_connected_consumer_is_not_deleted() -> None:
    q = _queue()
    _fill(q, 1)
    q.connect("g", "u", 0, 1, False, {})
    with pytest.raises(QueueError) as info:
        groups_admin.delete_group(q, "g")
    assert info.value.status == 409 and "1 connected consumer" in info.value.message
    assert sorted(q.records) == [1]


def test_a_group_idle_past_its_ttl_is_deleted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    q = _queue(group_evict_idle_s=0.0)
    _abandon(q, "gone", take=2)
    _fill(q, 5)
    with pytest.raises(QueueError) as info:
        q.put(b"full", {}, None)
    assert info.value.status == 429  # pinned by the abandoned group; eviction is off
    now = time.monotonic()
    assert groups_admin.expire_idle(q, 60.0, now) == []  # not idle long enough yet
    with caplog.at_level(logging.WARNING, "gateway.queue"):
        gone = groups_admin.expire_idle(q, 60.0, now + 61)
        assert groups_admin.expire_idle(q, 60.0, now + 120) == []
    assert [(gid, n) for gid, n, _ in gone] == [("gone", 5)]
    assert [r.message for r in caplog.records if "group gone deleted" in r.message] != []
    assert len(caplog.records) == 1
    assert q.length == 0 and q.put(b"room", {}, None)[0] == 6


def test_a_full_queue_evicts_the_oldest_records_only_idle_groups_need(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = _queue(group_evict_idle_s=30.0)
    _abandon(q, "gone")
    _fill(q, 5)
    with pytest.raises(QueueError):
        q.put(b"x", {}, None)  # idle for less than group_evict_idle_s
    later = time.monotonic() + 31
    monkeypatch.setattr(retention.time, "monotonic", lambda: later)
    with caplog.at_level(logging.WARNING, "gateway.queue"):
        assert q.put(b"six", {}, None)[0] == 6
        assert q.put(b"seven", {}, None)[0] == 7
    assert sorted(q.records) == [3, 4, 5, 6, 7]  # the oldest went first; the group stays
    assert "gone" in q.groups
    assert len([r for r in caplog.records if "evicted" in r.message]) == 1  # then at most once a minute


def test_eviction_spares_records_a_connected_group_or_no_group_needs() -> None:
    q = _queue(group_evict_idle_s=0.001)
    _fill(q, 5)
    c, _ = q.connect("gone", "u", 6, 1, False, {})  # starts after them: they are owed to nobody
    q.disconnect(c)
    time.sleep(0.01)
    with pytest.raises(QueueError) as info:
        q.put(b"x", {}, None)
    assert info.value.status == 429 and q.length == 5  # back-pressure, nothing evicted

    q = _queue(group_evict_idle_s=0.001)
    _abandon(q, "gone")
    q.connect("live", "u", 0, 1, False, {})  # connected: what it needs is never evicted
    _fill(q, 5)
    time.sleep(0.01)
    with pytest.raises(QueueError) as info:
        q.put(b"x", {}, None)
    assert info.value.status == 429 and q.length == 5


def test_a_queue_at_max_bytes_evicts_by_the_same_rule() -> None:
    q = Queue(
        "q", QueueConfig(max_length=100, max_bytes=10, group_evict_idle_s=0.001), MemoryBackend(), grace_s=0
    )
    _abandon(q, "gone")
    _fill(q, 5)  # five records of 2 bytes: the queue holds max_bytes
    time.sleep(0.01)
    assert q.put(b"four", {}, None)[0] == 6  # two of the oldest make room for 4 bytes
    assert sorted(q.records) == [3, 4, 5, 6] and q.bytes == 10
    q.connect("live", "u", 0, 1, False, {})  # a connected group needs them all now
    with pytest.raises(QueueError) as info:
        q.put(b"xx", {}, None)
    assert info.value.status == 429 and "max_bytes" in info.value.message and q.bytes == 10
