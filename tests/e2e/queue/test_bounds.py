"""The queue's bounds against a real server: payloads live on disk beyond ``memory_bytes``
(the server's RSS stays far below what the queue holds, across a kill -9 too), the byte cap
of a queue and of a get, and a watcher that holds records without reading them is closed."""

from __future__ import annotations

import http.client
import random
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from eas_sdk._proto.queue_pb2 import DataFrameProto
from eas_sdk.queue import QueueClient

from .server_proc import TOKEN, QueueServer, queue_config

MIB = 1024 * 1024
N = 200


def payload(i: int) -> bytes:
    return random.Random(i).randbytes(MIB)


def rss(server: QueueServer) -> int:
    return int(psutil.Process(server.proc.pid).memory_info().rss)


def client(server: QueueServer, name: str) -> QueueClient:
    q = QueueClient(server.endpoint, name)
    q.set_token(TOKEN)
    q.init(uid="reader")
    return q


def watch_back(q: QueueClient, n: int, timeout: float = 20.0) -> dict[int, bytes]:
    """Watch (committing each) until n records arrived; bounded by time."""
    got: dict[int, bytes] = {}
    watcher = q.watch(0, 8)
    timer = threading.Timer(timeout, watcher.close)
    timer.start()
    for df in watcher.run():
        got[df.index] = bytes(df.data)
        q.commit(df.index)
        if len(got) == n:
            break
    timer.cancel()
    watcher.close()
    return got


def test_payloads_live_on_disk_across_a_kill9(tmp_path: Path) -> None:
    cfg = queue_config(
        tmp_path / "data", ["big"], memory_bytes=8 * MIB, max_payload_bytes=2 * MIB, max_get_bytes=4 * MIB
    )
    server = QueueServer.start(cfg, tmp_path)
    try:
        q = client(server, "big")
        q.put(b"warm-up")
        q.get(auto_delete=True)
        base = rss(server)
        indexes = [int(q.put(payload(i))[0]) for i in range(N)]
        grown = rss(server) - base
        assert grown < 64 * MIB, f"RSS grew {grown / MIB:.0f} MiB holding {N} MiB of records"
        # A get answers at most max_get_bytes (4 records of 1 MiB), byte-identical.
        got = q.get(index=0, length=N, auto_delete=False, timeout="0s")
        assert [int(df.index) for df in got] == indexes[:4]
        assert [bytes(df.data) for df in got] == [payload(i) for i in range(4)]
        half = watch_back(q, N // 2)
        assert half == {indexes[i]: payload(i) for i in range(N // 2)}
        q.close()

        server.kill()
        server = server.restart()
        base = rss(server)
        q = client(server, "big")
        assert q.attributes()["stream.length"] == str(N - N // 2)
        rest = watch_back(q, N - N // 2)
        assert rest == {indexes[i]: payload(i) for i in range(N // 2, N)}
        grown = rss(server) - base
        assert grown < 64 * MIB, f"RSS grew {grown / MIB:.0f} MiB delivering {N // 2} MiB after a restart"
        q.close()
    finally:
        server.kill()


def test_max_bytes_refuses_a_put(tmp_path: Path) -> None:
    server = QueueServer.start(queue_config(tmp_path / "data", ["capped"], max_bytes=3000), tmp_path)
    try:
        q = client(server, "capped")
        for _ in range(3):
            q.put(b"x" * 1000)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("POST", "/api/predict/capped", body=b"y", headers={"Authorization": TOKEN})
        resp = conn.getresponse()
        body = resp.read().decode()
        conn.close()
        assert resp.status == 429 and "max_bytes 3000" in body, (resp.status, body)
        q.close()
    finally:
        server.kill()


@pytest.mark.parametrize("reads", [True, False])
def test_idle_watcher_is_closed_and_its_records_redelivered(tmp_path: Path, reads: bool) -> None:
    """A watcher that holds its window without committing (``reads``), or does not even read
    its deliveries, is closed after watcher_idle_s; another consumer of the group gets them."""
    size = 600 * 1024  # big enough that an unread window fills the socket buffers
    cfg = queue_config(
        tmp_path / "data", ["jobs"], watcher_idle_s=1.0, max_payload_bytes=MIB, heartbeat_s=0.5
    )
    server = QueueServer.start(cfg, tmp_path)
    try:
        q = client(server, "jobs")
        indexes = [int(q.put(bytes([i]) * size)[0]) for i in range(8)]
        url = f"ws://127.0.0.1:{server.port}/api/predict/jobs?_watch_=true&_window_=8&_index_=0"
        headers = {"Authorization": TOKEN, "X-EAS-QueueService-Redis-Uid": "idler"}
        ws = connect(
            url, additional_headers=headers, proxy=None, compression=None, max_size=2 * MIB, legacy=True
        )
        start = time.monotonic()
        if reads:
            for i in range(8):
                df = DataFrameProto()
                df.ParseFromString(ws.recv(timeout=5))
                assert df.index == indexes[i]
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
            assert "idle" in closed.value.rcvd.reason
        else:
            time.sleep(1.5)  # reads nothing; the server closes (or drops) the connection
        # Nothing is lost: another consumer of the group gets every record, each once.
        got = watch_back(q, 8)
        assert sorted(got) == indexes and all(got[idx] == bytes([i]) * size for i, idx in enumerate(indexes))
        assert time.monotonic() - start < 10
        ws.close()
        q.close()
    finally:
        server.kill()


def test_auto_commit_watcher_that_never_reads_is_dropped(tmp_path: Path) -> None:
    """An auto-commit watcher holds nothing in its window; what it holds is frames its socket
    does not take. Never reading, it is dropped after watcher_idle_s (no close frame can
    reach it) instead of holding its connection and a slice of payloads for ever."""
    cfg = queue_config(
        tmp_path / "data", ["firehose"], watcher_idle_s=1.0, max_payload_bytes=MIB, heartbeat_s=60
    )
    server = QueueServer.start(cfg, tmp_path)
    try:
        q = client(server, "firehose")
        for i in range(24):
            q.put(payload(i))
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(
            b"GET /api/predict/firehose?_watch_=true&_window_=0&_auto_commit_=true HTTP/1.1\r\nHost: x\r\n"
            b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nAuthorization: " + TOKEN.encode() + b"\r\n\r\n"
        )
        assert sock.recv(12) == b"HTTP/1.1 101"
        deadline = time.monotonic() + 5
        connected = "1"
        while time.monotonic() < deadline:
            connected = q.attributes()["consumers.stats.connected"]
            if connected == "0":
                break
            time.sleep(0.2)
        assert connected == "0", "a watcher that never reads was kept"
        sock.close()
        q.close()
    finally:
        server.kill()
