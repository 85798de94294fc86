"""The queue client against the real queue server: an idempotent put, a silent server."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable

from eas_sdk.queue import QueueClient

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
    import base64
    import hashlib

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
            req = b""
            while b"\r\n\r\n" not in req:
                req += conn.recv(4096)
            key = next(
                line.split(b": ", 1)[1]
                for line in req.split(b"\r\n")
                if line.lower().startswith(b"sec-websocket-key")
            )
            digest = hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()  # noqa: S324 (RFC 6455)
            accept = base64.b64encode(digest)
            conn.sendall(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n" + b"\x82\x02\x08\x01"  # one frame: index 1
            )
            accepted.append(conn)  # then silence: no pongs, no data

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
