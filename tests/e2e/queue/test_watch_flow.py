"""A watcher that stops reading is held back by TCP flow control: the server neither buffers
its window of records in memory nor spends CPU polling the stalled connection."""

from __future__ import annotations

import base64
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from eas_sdk.queue import QueueClient

from .server_proc import TOKEN, QueueServer, queue_config

RECORD = 60 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueueServer]:
    workdir: Path = tmp_path_factory.mktemp("queue-flow")
    srv = QueueServer.start(queue_config(workdir / "data", ["flow"], max_window=1024), workdir)
    yield srv
    srv.stop()


def _stalled_watch(port: int) -> socket.socket:
    """A WebSocket watch whose client never reads a frame (a raw upgrade, then silence)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            "GET /api/predict/flow?_watch_=true&_window_=1000&_index_=0 HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: {TOKEN}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def test_a_stalled_watcher_costs_no_cpu_and_bounded_memory(server: QueueServer) -> None:
    proc = psutil.Process(server.proc.pid)
    q = QueueClient(f"127.0.0.1:{server.port}", "flow")
    q.set_token(TOKEN)
    q.init()
    payload = b"x" * RECORD
    for _ in range(600):  # 36 MB waiting when the watcher connects: one hand-out of 600 records
        q.put(payload)
    time.sleep(0.2)
    base_rss = proc.memory_info().rss
    watch = _stalled_watch(server.port)
    try:
        time.sleep(0.5)  # the writer fills the socket buffers and stops
        proc.cpu_percent(interval=None)
        time.sleep(2.0)  # long enough for the clock-tick accounting to resolve a few percent
        cpu = proc.cpu_percent(interval=None)
        grown_mb = (proc.memory_info().rss - base_rss) / (1 << 20)
        print(f"cpu {cpu:.1f}% rss +{grown_mb:.1f} MB")
        # Polling for the peer every few ms cost about 30%; the server's own timers a few %.
        assert cpu < 15.0, f"{cpu:.1f}% CPU while the watcher is stalled"
        # The records are the store's; what waits for the peer is at most a few hundred kB
        # (writing the whole hand-out at once would copy all 36 MB into the socket's buffer).
        assert grown_mb < 16, f"RSS grew {grown_mb:.0f} MB"
    finally:
        watch.close()
        q.close()
