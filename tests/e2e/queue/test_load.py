"""Sustained load, scaled down: 4 producers and 2 watchers of one group (window 16) with commits."""

from __future__ import annotations

import threading
from collections.abc import Callable

from eas_sdk.queue import QueueClient

PRODUCERS = 4
PER_PRODUCER = 250


def test_producers_and_watchers_exactly_once(make_client: Callable[..., QueueClient]) -> None:
    total = PRODUCERS * PER_PRODUCER
    received: dict[str, list[tuple[int, str]]] = {"w1": [], "w2": []}
    lock = threading.Lock()
    done = threading.Event()
    acked: list[str] = []

    def produce(k: int) -> None:
        q = make_client()
        for i in range(PER_PRODUCER):
            _, rid = q.put(f"{k}:{i}")
            with lock:
                acked.append(rid)

    watchers_by_uid: dict[str, object] = {}

    def watch(uid: str) -> None:
        q = make_client(uid=uid)
        watcher = q.watch(0, 16)
        watchers_by_uid[uid] = watcher
        frames = watcher.run()  # kept referenced: leaving the loop must not drop the connection
        for df in frames:
            q.commit(df.index)  # committed before it counts: a later close releases nothing
            with lock:
                received[uid].append((df.index, df.data.decode()))
                if sum(len(v) for v in received.values()) >= total:
                    done.set()
            if done.is_set():
                break
        frames.close()

    watchers = [threading.Thread(target=watch, args=(u,)) for u in received]
    producers = [threading.Thread(target=produce, args=(k,)) for k in range(PRODUCERS)]
    for t in watchers + producers:
        t.start()
    for t in producers:
        t.join(40)
    # Once everything arrived (or time is up), close both watchers: one may be blocked in recv.
    done.wait(40)
    for w in watchers_by_uid.values():
        w.close()  # type: ignore[attr-defined]
    for t in watchers:
        t.join(10)
    indexes = [i for got in received.values() for i, _ in got]
    assert len(indexes) == len(set(indexes)) == total, "lost or duplicated records"
    assert len(acked) == total
    for got in received.values():
        # Each producer's records arrive at a consumer in the order they were put.
        last: dict[str, int] = {}
        for _idx, data in got:
            k, i = data.split(":")
            assert int(i) > last.get(k, -1)
            last[k] = int(i)
    assert received["w1"] and received["w2"], "both consumers of the group must share the load"
