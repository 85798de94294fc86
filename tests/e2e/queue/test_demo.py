"""The eas-prediction documentation's demo (a producer thread and a watcher thread) with our
SDK and with the real eas-prediction 0.36 client, plus the reference client's own queue test cases."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from eas_sdk.errors import BadRequestError, NotFoundError
from eas_sdk.queue import AsyncQueueClient, QueueClient, to_pandas
from tests.eas_reference import run_reference

from .server_proc import TOKEN, QueueServer


def test_demo_our_sdk(make_client: Callable[..., QueueClient]) -> None:
    producer, consumer = make_client(), make_client()
    sent: set[str] = set()
    received: list[str] = []

    def produce() -> None:
        for i in range(100):
            _index, rid = producer.put(f"[{i}]")
            sent.add(rid)

    def watch() -> None:
        watcher = consumer.watch(0, 5, auto_commit=True)
        for df in watcher.run():
            received.append(df.tags["requestId"])
            if len(received) == 100:
                break
        watcher.close()

    threads = [threading.Thread(target=watch), threading.Thread(target=produce)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(received) == 100 and set(received) == sent
    assert producer.attributes()["stream.length"] == "0"


def test_reference_api_semantics(make_client: Callable[..., QueueClient]) -> None:
    q = make_client()
    index, rid = q.put("abc", tags={"k": "v"})
    assert index == "1" and rid
    got = q.get(request_id=rid)
    assert [(d.data, d.tags["k"], d.tags["requestId"]) for d in got] == [(b"abc", "v", rid)]
    assert q.attributes()["stream.length"] == "0"  # auto_delete
    index, _ = q.put("abc")
    assert [d.data for d in q.get(index=index, auto_delete=False)] == [b"abc"]
    assert q.search(index)["IsPending"] is False
    q.commit(int(index))
    q.commit(int(index))  # idempotent
    with pytest.raises(NotFoundError):
        q.commit(int(index) + 100)  # never put: 4xx, not retried
    last = 0
    for i in range(10):
        last = int(q.put(str(i))[0])
    attrs = q.attributes()
    assert attrs["stream.length"] == "10" and int(attrs["stream.lastEntry"]) == last
    assert attrs["meta.header.user"] == "X-EAS-QueueService-Redis-Uid"
    q.truncate(last)  # everything below `last`
    assert q.attributes()["stream.length"] == "1"
    q.delete(last)
    assert q.attributes()["stream.length"] == "0"
    t0 = time.monotonic()
    assert q.get(timeout="1s") == []  # long poll: empty list, answered before the timeout
    # It waited (a long poll, not an immediate answer) and answered well before the client gave up.
    assert 0.5 < time.monotonic() - t0 < 3.0
    with pytest.raises(BadRequestError):
        q.commit("abc")
    frame = to_pandas([type(got[0])(1, b"x", {"a": "b"})])
    assert list(frame.columns) == ["index", "data", "message", "tags"]


def test_watch_manual_commit_in_order(make_client: Callable[..., QueueClient]) -> None:
    q = make_client()
    for i in range(10):
        q.put(str(i))
    with q.watch(0, 5) as watcher:
        seen = []
        for df in watcher.run():
            seen.append(int(df.data))
            q.commit(df.index)
            if len(seen) == 10:
                break
    assert seen == list(range(10))
    assert q.attributes()["stream.length"] == "0"


async def test_async_client_watch(queue_server: QueueServer, queue_name: str) -> None:
    async with AsyncQueueClient(queue_server.endpoint, queue_name) as q:
        q.set_token(TOKEN)
        q.init()
        ids = {(await q.put(f"a{i}"))[1] for i in range(20)}
        got: set[str] = set()
        batch: list[int] = []
        async with q.watch(0, 8) as watcher:
            async for df in watcher:
                got.add(df.tags["requestId"])
                batch.append(df.index)
                if len(batch) == 4:  # several indexes per commit call
                    await q.commit(batch)
                    batch = []
                if len(got) == 20:
                    break
        assert got == ids
        assert (await q.attributes())["stream.length"] == "0"
        assert await q.get(timeout="0s") == []


REFERENCE_DEMO = r"""
import sys, threading, json
from eas_prediction import QueueClient
endpoint, name, token = sys.argv[1:4]
def client():
    c = QueueClient(endpoint, name); c.set_token(token); c.init(); return c
producer, watcher_client = client(), client()
sent, received = set(), []
def produce():
    for _ in range(100):
        index, rid = producer.put('[{}]'); sent.add(rid)
def watch():
    w = watcher_client.watch(0, 5, auto_commit=True)
    for x in w.run():
        received.append(x.tags['requestId'])
        if len(received) == 100: break
    w.close()
ts = [threading.Thread(target=watch), threading.Thread(target=produce)]
[t.start() for t in ts]; [t.join(30) for t in ts]
assert len(received) == 100 and set(received) == sent, (len(received), len(sent))
assert producer.attributes()['stream.length'] == '0'
# test_queue_client.py cases: get by request id / index, truncate, manual commit
index, rid = producer.put('abc')
assert producer.get(request_id=rid)[0].data == b'abc'
index, rid = producer.put('abc')
assert producer.get(index=index)[0].data == b'abc'
last = 0
for x in range(10):
    last, _ = producer.put('abc')
assert int(producer.attributes()['stream.length']) > 1
producer.truncate(int(last) + 1)
assert int(producer.attributes()['stream.length']) == 0
for x in range(10):
    producer.put(str(x))
w = watcher_client.watch(0, 5, auto_commit=False)
i = 0
for x in w.run():
    assert int(x.data.decode()) == i; i += 1
    watcher_client.commit(x.index)
    if i == 10: break
w.close()
assert int(producer.attributes()['stream.length']) == 0
print(json.dumps({'ok': True}))
"""


@pytest.mark.compat
def test_demo_reference_client(queue_server: QueueServer, queue_name: str) -> None:
    proc = run_reference(REFERENCE_DEMO, queue_server.endpoint, queue_name, TOKEN, timeout=90)
    assert b'"ok": true' in proc.stdout


def test_asyncio_twin_shares_core() -> None:
    # The sync and async clients build identical URLs and headers from the same core.
    s, a = QueueClient("127.0.0.1:1", "svc/sink"), AsyncQueueClient("127.0.0.1:1", "svc/sink")
    s.init(uid="u", gid="g")
    a.init(uid="u", gid="g")
    s.set_token("secret-tok-123")
    a.set_token("secret-tok-123")
    assert s.base_url == a.base_url == "http://127.0.0.1:1/api/predict/svc/sink"
    assert s._headers(True) == a._headers(True)
    assert "secret-tok-123" not in repr(s) and "secret-tok-123" not in repr(a)
    asyncio.run(a.close())
