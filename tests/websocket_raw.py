"""A WebSocket server's side of the handshake by hand, for tests whose server must misbehave
after it (stay silent, never answer a ping)."""

from __future__ import annotations

import base64
import hashlib
import socket


def accept_upgrade(conn: socket.socket, then: bytes = b"") -> None:
    """Read the client's upgrade request from ``conn`` and answer 101, followed by ``then``
    (raw frames) in the same write."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("the client left during the handshake")
        head += chunk
    lines = head.split(b"\r\n")
    key = next(line.split(b": ", 1)[1] for line in lines if line.lower().startswith(b"sec-websocket-key"))
    digest = hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()  # noqa: S324 (RFC 6455)
    conn.sendall(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + base64.b64encode(digest) + b"\r\n\r\n" + then
    )
