"""The queue client against the real queue server: an idempotent put, a silent server."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable

from eas_sdk.queue import QueueClient
from tests.websocket_raw import accept_upgrade

from .server_proc import TOKEN, QueueServer


def test_idempotent_put_with_request_id(queue_server: QueueServer, queue_name: str) -> None:
    def put(rid: str) -> tuple[int, str, str]:
        conn = http.client.HTTPConnection("127.0.0.1", queue_server.port, timeout=5)
        conn.request(
            "POST",
            f"/api/predict/{queue_name}",
            body=b"once",
            headers={"Authorization": TOKEN, "X-Request-Id": rid},
        )
        r = conn.getresponse()
        out = (r.status, r.read().decode(), r.headers["X-Eas-Queueservice-Request-Id"])
        conn.close()
        return out

    first, again = put("retry-me"), put("retry-me")
    assert first == again and first[0] == 200  # a retried put is stored once, same index


def test_watcher_notices_silent_server_and_reconnects(make_client: Callable[..., QueueClient]) -> None:
    """A server that stops answering pings is left after ping_interval + ping_timeout."""
    accepted: list[socket.socket] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            accepted.append(conn)  # kept open after the frame, silent: no pongs, no data
            try:
                accept_upgrade(conn, then=b"\x82\x02\x08\x01")  # one frame: index 1
            except OSError:
                continue  # the client left mid-handshake

    threading.Thread(target=serve, daemon=True).start()
    q = QueueClient(f"127.0.0.1:{sock.getsockname()[1]}", "q")
    q.ping_interval = q.ping_timeout = 0.5
    q.init()
    watcher = q.watch(0, 1)
    t0 = time.monotonic()
    got = []
    for df in watcher.run():
        got.append(df.index)
        if len(got) == 2:
            break
    elapsed = time.monotonic() - t0
    watcher.close()
    sock.close()
    for c in accepted:
        c.close()
    assert got == [1, 1] and watcher.reconnects == 1
    assert elapsed < 15  # by the client's pings (0.5 s + 0.5 s), not by TCP keep-alive
