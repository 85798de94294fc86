"""Watch options (index_only, tags), tag-filtered get, protobuf attributes, grace, groups,
size caps and truncate. Tests taking ``store_client`` run with the queue in SQLite and in Redis."""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable

import pytest

from eas_sdk._proto.queue_pb2 import AttributesProto
from eas_sdk.errors import HTTPStatusError
from eas_sdk.queue import QueueClient
from gateway.config import QueueConfig
from gateway.queue.store import MemoryBackend, Queue

from .server_proc import TOKEN, QueueServer


def first(q: QueueClient, n: int, **watch: object) -> list:  # type: ignore[type-arg]
    out = []
    with q.watch(0, 8, **watch) as watcher:  # type: ignore[arg-type]
        frames = watcher.run()
        for df in frames:
            out.append(df)
            if len(out) == n:
                break
        frames.close()
    return out


def test_index_only_and_tag_filters(store_client: Callable[..., QueueClient]) -> None:
    q = store_client()
    for i in range(6):
        q.put(f"d{i}", tags={"color": "red" if i % 2 else "blue"})
    frames = first(q, 3, index_only=True, auto_commit=True, tags={"color": "red"})
    assert [f.index for f in frames] == [2, 4, 6]
    assert all(f.data == b"" and f.tags["color"] == "red" and f.tags["requestId"] for f in frames)
    got = q.get(index=0, length=10, auto_delete=False, timeout="0s", tags={"color": "blue"})
    assert [(g.index, g.data) for g in got] == [(1, b"d0"), (3, b"d2"), (5, b"d4")]


def test_groups_each_get_every_record(store_client: Callable[..., QueueClient]) -> None:
    a, b = store_client(gid="ga"), store_client(gid="gb")
    # A record is deleted only when both groups committed it.
    wa, wb = a.watch(0, 4), b.watch(0, 4)
    ra, rb = wa.run(), wb.run()
    indexes = [int(a.put(f"r{i}")[0]) for i in range(3)]
    got_a = [next(ra).index for _ in range(3)]
    got_b = [next(rb).index for _ in range(3)]
    assert got_a == got_b == indexes
    a.commit(indexes)
    assert a.attributes()["stream.length"] == "3"  # group gb still owes them
    b.commit(indexes)
    assert a.attributes()["stream.length"] == "0"
    ra.close()
    rb.close()


def test_attributes_as_protobuf(queue_server: QueueServer, queue_name: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", queue_server.port, timeout=5)
    conn.request(
        "GET",
        f"/api/predict/{queue_name}?_attrs_=true",
        headers={"Authorization": TOKEN, "Accept": "application/vnd.google.protobuf"},
    )
    resp = conn.getresponse()
    msg = AttributesProto()
    msg.ParseFromString(resp.read())
    conn.close()
    assert resp.status == 200 and msg.attributes["meta.header.user"] == "X-EAS-QueueService-Redis-Uid"
    assert msg.attributes["stream.length"] == "0"


def test_grace_keeps_records_for_the_same_uid() -> None:
    q = Queue("g", QueueConfig(), MemoryBackend(), grace_s=30)
    for i in range(3):
        q.put(f"r{i}".encode(), {}, None)
    c, _ = q.connect("eas", "u1", 0, 2, False, {})
    assert [r.idx for r, _ in q.take(c)[0]] == [1, 2]
    q.disconnect(c)
    other, _ = q.connect("eas", "u2", 0, 5, False, {})
    assert [r.idx for r, _ in q.take(other)[0]] == [3]  # 1 and 2 wait for u1 during the grace
    again, _ = q.connect("eas", "u1", 0, 2, False, {})
    out, _ = q.take(again)
    assert [(r.idx, n) for r, n in out] == [(1, 2), (2, 2)]  # resent, delivery count 2
    q.disconnect(again)
    q.release(again)  # grace over: the group gets them
    assert sorted(r.idx for r, _ in q.take(other)[0]) == [1, 2]


def test_search_and_wait_count(store_client: Callable[..., QueueClient]) -> None:
    q = store_client(uid="s1")
    idx = [int(q.put(f"r{i}")[0]) for i in range(4)]
    assert q.search(idx[3]) == {"ConsumerId": "", "IsPending": False, "WaitCount": 3}
    with q.watch(0, 1) as watcher:
        frames = watcher.run()
        assert next(frames).index == idx[0]
        deadline = time.monotonic() + 5
        while not q.search(idx[0]).get("IsPending") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert q.search(idx[0]) == {"ConsumerId": "eas.s1", "IsPending": True, "WaitCount": 0}
        assert q.search(idx[3])["WaitCount"] == 2
        frames.close()
    assert q.search(10_000) == {}  # unknown index: 404, which the SDK turns into {}


def test_commit_from_a_gid_that_never_watched_creates_no_group(
    store_client: Callable[..., QueueClient],
) -> None:
    """The reference client's get() then commit() with the default gid on a queue nobody
    watches deletes the record, and leaves no group behind that later records would wait
    for: a group that does watch and commits everything empties the queue."""
    q = store_client()  # gid eas
    index, _ = q.put(b"read")
    assert [d.index for d in q.get(index=index, auto_delete=False, timeout="0s")] == [int(index)]
    q.commit(int(index))
    assert q.attributes()["stream.length"] == "0"
    assert q.attributes()["groups.stats.total"] == "0"
    w = store_client(gid="workers")
    indexes = [int(q.put(f"r{i}")[0]) for i in range(3)]
    assert [df.index for df in first(w, 3, auto_commit=True)] == indexes
    assert q.attributes()["stream.length"] == "0"


def test_commit_from_an_unknown_gid_of_a_record_a_group_needs_is_refused(
    queue_server: QueueServer, make_client: Callable[..., QueueClient], queue_name: str
) -> None:
    w = make_client(gid="workers")
    with w.watch(0, 1) as watcher:  # the group exists and is owed every record
        index, _ = w.put(b"x")
        frames = watcher.run()
        assert next(frames).index == int(index)
        other = make_client(gid="reader")
        assert [d.index for d in other.get(index=index, auto_delete=False, timeout="0s")] == [int(index)]
        conn = http.client.HTTPConnection("127.0.0.1", queue_server.port, timeout=5)
        conn.request(
            "PUT",
            f"/api/predict/{queue_name}?_indexes_={index}",
            b"",
            {"Authorization": TOKEN, "X-EAS-QueueService-Redis-Gid": "reader"},
        )
        resp = conn.getresponse()
        text = resp.read().decode()
        conn.close()
        assert resp.status == 404 and "reader" in text and "workers" in text, text
        assert w.attributes()["stream.length"] == "1"
        w.commit(int(index))
        frames.close()
    assert w.attributes()["stream.length"] == "0"
    assert w.attributes()["groups.stats.total"] == "1"


def test_size_caps_and_truncate(store_client: Callable[..., QueueClient]) -> None:
    q = store_client(name="small")  # max_length 3, max_payload_bytes 16 (a shared queue)
    q.truncate(1_000_000)
    with pytest.raises(HTTPStatusError) as info:
        q.put(b"x" * 17)
    assert info.value.code == 413
    q.set_retry_count(0)
    indexes = [int(q.put(b"ok")[0]) for _ in range(3)]
    with pytest.raises(HTTPStatusError) as info:
        q.put(b"ok")
    assert info.value.code == 429  # refused, nothing evicted
    assert q.attributes()["stream.length"] == "3"
    q.truncate(indexes[1])  # everything below the second
    got = q.get(index=0, length=10, auto_delete=False, timeout="0s")
    assert [int(g.index) for g in got] == indexes[1:]
    q.truncate(1_000_000)
    assert q.attributes()["stream.length"] == "0"


def test_search_for_an_index_not_in_the_queue_answers_404_as_every_queue_error(
    queue_server: QueueServer, queue_name: str
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", queue_server.port, timeout=5)
    path = f"/api/predict/{queue_name}?_search_=true&_index_=10000"
    conn.request("GET", path, headers={"Authorization": TOKEN})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    assert resp.status == 404
    assert resp.getheader("Content-Type", "").startswith("text/plain")
    assert body == b"index 10000 is not in the queue"
