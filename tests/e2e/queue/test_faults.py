"""Fault tests: consumers that die or go silent, and the queue server killed with SIGKILL."""

from __future__ import annotations

import base64
import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eas_sdk.queue import QueueClient

from .server_proc import ROOT, SERVERS, TOKEN, QueueServer, queue_config, wait_serving

pytestmark = pytest.mark.fault

CONSUMER = r"""
import sys
from eas_sdk.queue import QueueClient
endpoint, name, token, commit_first = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
q = QueueClient(endpoint, name); q.set_token(token); q.init(uid="victim")
seen = []
for df in q.watch(0, 8).run():
    seen.append(df.index)
    if len(seen) <= commit_first:
        q.commit(df.index)
    if len(seen) == 8:
        print(" ".join(map(str, seen)), flush=True)
        break_here = True
        import time
        time.sleep(120)   # holds its window without committing until killed
"""


def collect(q: QueueClient, n: int, window: int, commit: bool, timeout: float = 20.0) -> list[int]:
    """Watch until n records arrived (commit each when asked); bounded by time."""
    got: list[int] = []
    watcher = q.watch(0, window)
    done = threading.Event()

    def guard() -> None:
        if not done.wait(timeout):
            watcher.close()

    threading.Thread(target=guard, daemon=True).start()
    for df in watcher.run():
        got.append(df.index)
        if commit:
            q.commit(df.index)
        if len(got) >= n:
            break
    done.set()
    watcher.close()
    return got


def test_consumer_killed_mid_window(
    store_server: QueueServer, store_client: Callable[..., QueueClient], queue_name: str
) -> None:
    """Windows and redelivery, with the queue in SQLite and in Redis."""
    make_client = store_client
    producer = make_client()
    indexes = [int(producer.put(f"r{i}")[0]) for i in range(20)]
    proc = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, store_server.endpoint, queue_name, TOKEN, "3"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        victim_saw = [int(x) for x in proc.stdout.readline().split()]
        assert victim_saw == indexes[:8]
        attrs = producer.attributes()
        assert attrs["consumers.stats.connected"] == "1"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    # The other consumer of the group gets everything the victim had not committed, once.
    other = make_client(uid="survivor")
    got = collect(other, 17, window=4, commit=True)
    assert sorted(got) == indexes[3:], "lost or duplicated records"
    assert len(got) == len(set(got))
    assert producer.attributes()["stream.length"] == "0"


def _raw_watch(port: int, path: str, uid: str) -> socket.socket:
    """A WebSocket watch opened by hand, so the test can go silent or drop TCP without a close frame."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: {TOKEN}\r\n"
            f"X-EAS-QueueService-Redis-Uid: {uid}\r\nX-EAS-QueueService-Redis-Gid: eas\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(4096)
    assert head.startswith(b"HTTP/1.1 101"), head[:100]
    return s


@pytest.mark.parametrize("how", ["silent", "tcp_close"])
def test_dead_consumer_detected(
    queue_server: QueueServer, make_client: Callable[..., QueueClient], queue_name: str, how: str
) -> None:
    producer = make_client()
    indexes = [int(producer.put(f"r{i}")[0]) for i in range(6)]
    s = _raw_watch(queue_server.port, f"/api/predict/{queue_name}?_watch_=true&_index_=0&_window_=3", "ghost")
    try:
        deadline = time.monotonic() + 5
        while producer.search(indexes[2]).get("IsPending") is not True and time.monotonic() < deadline:
            time.sleep(0.05)
        assert producer.search(indexes[0])["ConsumerId"] == "eas.ghost"
        t0 = time.monotonic()
        if how == "tcp_close":
            s.close()  # a bare FIN: no close frame
        # "silent": keep the socket open but never answer the server's pings (heartbeat 1 s).
        other = make_client(uid="healthy")
        got = collect(other, 6, window=6, commit=True, timeout=10)
        elapsed = time.monotonic() - t0
    finally:
        s.close()
    assert sorted(got) == indexes
    if how == "silent":
        # Noticed by the 1 s heartbeat, not by TCP keep-alive (minutes): a generous bound.
        assert elapsed < 10, f"silent consumer noticed after {elapsed:.1f}s (heartbeat 1 s)"
    assert producer.attributes()["stream.length"] == "0"


def test_reconnect_same_uid_gets_its_records_back(
    make_client: Callable[..., QueueClient], queue_server: QueueServer, queue_name: str
) -> None:
    producer = make_client()
    indexes = [int(producer.put(f"r{i}")[0]) for i in range(4)]
    s = _raw_watch(queue_server.port, f"/api/predict/{queue_name}?_watch_=true&_index_=0&_window_=2", "same")
    try:
        deadline = time.monotonic() + 5
        while producer.search(indexes[1]).get("IsPending") is not True and time.monotonic() < deadline:
            time.sleep(0.05)
        # The same uid reconnects before the old connection is noticed dead: it takes over.
        again = make_client(uid="same")
        got = collect(again, 4, window=2, commit=True)
    finally:
        s.close()
    assert got[:2] == indexes[:2] and sorted(got) == indexes


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_server_kill9_during_puts_then_restart(
    tmp_path: Path, kind: str, store_settings: dict[str, Any]
) -> None:
    """SIGKILL of the queue-only server, or of the full gateway (its lean front and predict
    route's queue path in front of the same store), in the middle of a burst of puts; with
    the queue in SQLite and in Redis."""
    server: Any = SERVERS[kind].start(queue_config(tmp_path / "data", ["burst"], **store_settings), tmp_path)
    acked: list[tuple[int, str]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def producer(k: int) -> None:
        q = QueueClient(server.endpoint, "burst")
        q.set_token(TOKEN)
        q.set_retry_count(0)
        q.init()
        for i in range(2000):
            if stop.is_set():
                break
            try:
                idx, rid = q.put(f"p{k}-{i}".encode())
            except Exception:
                break
            with lock:
                acked.append((int(idx), rid))
        q.close()

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while len(acked) < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.kill()  # SIGKILL in the middle of the burst
        stop.set()
        for t in threads:
            t.join(15)
        assert len(acked) >= 200
        server = server.restart()
        wait_serving(server.port, "burst")
        q = QueueClient(server.endpoint, "burst")
        q.set_token(TOKEN)
        q.init()
        stored = q.get(index=0, length=10000, auto_delete=False, timeout="0s")
        by_rid = {d.tags["requestId"]: d.index for d in stored}
        indexes = [d.index for d in stored]
        assert len(indexes) == len(set(indexes)) == len(by_rid), "duplicate records"
        missing = [(i, r) for i, r in acked if by_rid.get(r) != i]
        assert not missing, f"{len(missing)} acknowledged puts lost, e.g. {missing[:3]}"
        # A put retried with the same X-Request-Id after the restart is stored once.
        for idx, rid in acked[-5:]:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            conn.request(
                "POST", "/api/predict/burst", b"again", {"Authorization": TOKEN, "X-Request-Id": rid}
            )
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, str(idx).encode())
            conn.close()
        assert q.attributes()["stream.length"] == str(len(stored))
        new_index = int(q.put(b"after")[0])
        assert new_index > max(indexes), "indexes must continue after a restart"
        q.close()
    finally:
        stop.set()
        server.kill()


def test_pending_records_redelivered_after_restart_and_watcher_resumes(tmp_path: Path) -> None:
    """Across a restart committed records never come back; delivered-but-uncommitted ones do,
    once more, and the watcher resumes."""
    server = QueueServer.start(queue_config(tmp_path / "data", ["w"]), tmp_path)
    try:
        q = QueueClient(server.endpoint, "w")
        q.set_token(TOKEN)
        q.init(uid="worker")
        indexes = [int(q.put(f"r{i}")[0]) for i in range(10)]
        got: list[int] = []
        watcher = q.watch(0, 5)
        restarted = threading.Event()
        holder: dict[str, QueueServer] = {}

        def guard() -> None:
            restarted.wait(30)
            time.sleep(20)
            watcher.close()  # bound the test if records never arrive

        threading.Thread(target=guard, daemon=True).start()
        for df in watcher.run():
            got.append(df.index)
            if df.index in indexes[:2] or restarted.is_set():
                q.commit(df.index)
            if len(got) == 5 and not restarted.is_set():
                # Restart on the same port so the watcher's reconnect finds it.
                port = server.port
                server.kill()
                cfg = queue_config(tmp_path / "data", ["w"])
                cfg["gateway"]["port"] = port
                holder["s"] = QueueServer.start(cfg, tmp_path / "again")
                restarted.set()
            if len(set(got)) == 10:
                break
        watcher.close()
        server = holder["s"]
        first, after = got[:5], got[5:]
        assert first == indexes[:5]
        assert not set(after) & set(indexes[:2]), "a committed record came back"
        assert sorted(set(after)) == indexes[2:], "records lost across the restart"
        assert after.count(indexes[2]) == 1 and watcher.reconnects >= 1
        q.close()
    finally:
        server.kill()
        if "s" in holder:
            holder["s"].kill()


def test_slow_consumer_is_not_robbed(make_client: Callable[..., QueueClient]) -> None:
    """A consumer that holds its window for 3 heartbeats while its connection stays healthy
    (pings answered) keeps its records: redelivery is for lost connections, not slowness."""
    slow = make_client(uid="slow")
    indexes = [int(slow.put(f"r{i}")[0]) for i in range(2)]
    with slow.watch(0, 2) as watcher:
        frames = watcher.run()
        held = [next(frames).index, next(frames).index]
        time.sleep(3.0)  # the server heartbeat is 1 s; our client answers pings in the background
        assert slow.search(indexes[0])["ConsumerId"] == "eas.slow"
        assert slow.attributes()["consumers.stats.connected"] == "1"
        slow.commit(held)
        frames.close()
    assert held == indexes


def _raw(port: int, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body, {"Authorization": TOKEN, **headers})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_commit_and_put_dedupe_survive_kill9(tmp_path: Path, store_settings: dict[str, Any]) -> None:
    """After SIGKILL and a restart, a retried commit of a committed record is still OK and a
    put retried with the X-Request-Id of a record consumed before the crash stores nothing
    (SQLite and Redis)."""
    server = QueueServer.start(queue_config(tmp_path / "data", ["d"], **store_settings), tmp_path)
    try:
        path = "/api/predict/d"
        for i in range(3):
            put = _raw(server.port, "POST", path, f"r{i}".encode(), **{"X-Request-Id": f"rid-{i}"})
            assert put == (200, str(i + 1).encode())
        q = QueueClient(server.endpoint, "d")
        q.set_token(TOKEN)
        q.init(uid="w")
        got = collect(q, 1, window=1, commit=True)  # 1 committed by a watcher
        assert got == [1]
        assert [d.index for d in q.get(index=2, timeout="0s")] == [2]  # 2 consumed by a get
        q.close()
        server.kill()
        server = server.restart()
        wait_serving(server.port, "d")
        assert _raw(server.port, "PUT", f"{path}?_indexes_=1", b"") == (200, b"OK")
        assert _raw(server.port, "PUT", f"{path}?_indexes_=2", b"") == (200, b"OK")
        for i in range(3):
            status, body = _raw(server.port, "POST", path, b"again", **{"X-Request-Id": f"rid-{i}"})
            assert (status, body) == (200, str(i + 1).encode())
        status, body = _raw(server.port, "GET", f"{path}?_count_=true")
        assert (status, body) == (200, b"1")  # only record 3, once
        assert _raw(server.port, "PUT", f"{path}?_indexes_=9", b"")[0] == 404
    finally:
        server.kill()


def _ws_watch(port: int, name: str, uid: str, window: int) -> Any:
    from websockets.sync.client import connect

    url = f"ws://127.0.0.1:{port}/api/predict/{name}?_watch_=true&_window_={window}&_index_=0"
    headers = {"Authorization": TOKEN, "X-EAS-QueueService-Redis-Uid": uid}
    return connect(url, additional_headers=headers, proxy=None, compression=None, legacy=True)


def _frames(ws: Any, timeout: float) -> list[int]:
    """Indexes of the frames that arrive within ``timeout`` s."""
    from eas_sdk._proto.queue_pb2 import DataFrameProto

    out: list[int] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            raw = ws.recv(timeout=left)
        except TimeoutError:
            break
        df = DataFrameProto()
        df.ParseFromString(raw)
        out.append(df.index)
    return out


def test_restart_during_grace_loses_nothing(tmp_path: Path) -> None:
    """grace_s on the SQLite store: a watcher that left keeps its records for its uid during
    the grace; a kill -9 then (which forgets who held what) redelivers them once after the
    restart, without waiting for the grace, and committed records never come back."""
    cfg = queue_config(tmp_path / "data", ["grace"], grace_s=30.0, heartbeat_s=1.0)
    server = QueueServer.start(cfg, tmp_path)
    try:
        path = "/api/predict/grace"
        indexes = [int(_raw(server.port, "POST", path, f"r{i}".encode())[1]) for i in range(6)]
        a = _ws_watch(server.port, "grace", "a", 3)
        assert _frames(a, 1.0) == indexes[:3]
        assert _raw(server.port, "PUT", f"{path}?_indexes_={indexes[0]}", b"") == (200, b"OK")
        assert _frames(a, 1.0) == indexes[3:4]  # the commit freed a slot
        a.close()  # a leaves holding 2, 3 and 4: they wait for it for 30 s
        b = _ws_watch(server.port, "grace", "b", 10)
        assert _frames(b, 1.0) == indexes[4:]  # not a's records
        for idx in indexes[4:]:
            assert _raw(server.port, "PUT", f"{path}?_indexes_={idx}", b"") == (200, b"OK")
        b.close()
        server.kill()
        server = server.restart()
        b = _ws_watch(server.port, "grace", "b", 10)
        t0 = time.monotonic()
        got = _frames(b, 2.0)
        assert got == indexes[1:4], got  # once each, the committed ones never
        assert time.monotonic() - t0 < 3.0
        for idx in got:
            assert _raw(server.port, "PUT", f"{path}?_indexes_={idx}", b"") == (200, b"OK")
        assert _raw(server.port, "GET", f"{path}?_count_=true") == (200, b"0")
        b.close()
    finally:
        server.kill()
