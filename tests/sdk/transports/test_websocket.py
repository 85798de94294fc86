"""The watcher's blocking WebSocket connection against websockets' own server (and a raw
socket where a server must misbehave): messages in order, fragments joined, pings answered
while the consumer is busy, backpressure to the server, keepalive, close, refusals, TLS."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.http11 import Response
from websockets.sync.server import Server, ServerConnection, serve

from eas_sdk._transports._shared import tls_context
from eas_sdk._transports.websocket import SyncWebSocket, WebSocketClosed
from tests.websocket_raw import accept_upgrade

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def start() -> Iterator[Callable[..., str]]:
    """Start websockets' server with a handler; returns its ws:// (or wss://) URL."""
    servers: list[Server] = []

    def run(handler: Callable[[ServerConnection], None], **options: Any) -> str:
        server = serve(handler, "127.0.0.1", 0, compression=None, **options)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        scheme = "wss" if options.get("ssl") else "ws"
        return f"{scheme}://127.0.0.1:{server.socket.getsockname()[1]}/"

    yield run
    for server in servers:
        server.shutdown()


def _connect(url: str, **options: Any) -> SyncWebSocket:
    return SyncWebSocket.connect(url, {"Authorization": "t"}, open_timeout=5, **options)


def test_messages_arrive_in_order_and_fragments_are_joined(start: Callable[..., str]) -> None:
    def handler(ws: ServerConnection) -> None:
        for i in range(2000):
            ws.send(i.to_bytes(4, "big"))
        ws.send([b"frag", b"ment", b"ed"])  # one message in three frames
        ws.send("text")
        ws.close()

    ws = _connect(start(handler))
    got = [int.from_bytes(ws.recv(), "big") for _ in range(2000)]  # type: ignore[arg-type]
    assert got == list(range(2000))
    assert ws.recv() == b"fragmented" and ws.recv() == "text"
    with pytest.raises(WebSocketClosed):
        ws.recv()
    ws.close()


def _recv_within(ws: SyncWebSocket, seconds: float) -> bytes | str:
    """``ws.recv()``, run in a thread so that a recv that never ends fails the test after
    ``seconds`` instead of hanging it; what recv raised is raised here."""
    got: list[bytes | str | BaseException] = []

    def recv() -> None:
        try:
            got.append(ws.recv())
        except BaseException as exc:  # handed to the test's thread
            got.append(exc)

    thread = threading.Thread(target=recv, daemon=True)
    thread.start()
    thread.join(seconds)
    assert got, f"recv still waiting after {seconds:g} s"
    if isinstance(got[0], BaseException):
        raise got[0]
    return got[0]


def test_the_handshake_carries_the_headers_and_a_refusal_raises(start: Callable[..., str]) -> None:
    seen: list[str | None] = []

    def handler(ws: ServerConnection) -> None:
        seen.append(ws.request.headers.get("Authorization") if ws.request else None)
        ws.send(b"ok")

    def refuse(conn: ServerConnection, request: Any) -> Response | None:
        if request.path == "/denied":
            return conn.respond(403, "token refused\n")
        return None

    url = start(handler, process_request=refuse)
    ws = _connect(url)
    assert ws.recv() == b"ok" and seen == ["t"]
    ws.close()
    with pytest.raises(InvalidStatus) as info:
        _connect(url + "denied")
    assert info.value.response.status_code == 403 and info.value.response.body == b"token refused\n"


def test_pings_are_answered_while_the_consumer_is_busy(start: Callable[..., str]) -> None:
    """The server pings every 0.1 s and gives up after 0.5 s without a pong: a consumer that
    takes 1.5 s for one record keeps its connection."""
    go = threading.Event()

    def handler(ws: ServerConnection) -> None:
        ws.send(b"first")
        go.wait(10)
        ws.send(b"second")
        ws.recv()  # until the client closes

    ws = _connect(start(handler, ping_interval=0.1, ping_timeout=0.5))
    assert ws.recv() == b"first"
    time.sleep(1.5)  # the consumer is busy with its record for three ping timeouts
    go.set()
    assert ws.recv() == b"second"
    ws.close()


def test_a_consumer_that_falls_behind_slows_the_server(start: Callable[..., str]) -> None:
    """With max_queue messages waiting the reader stops reading: the server's sends block
    once the socket buffers are full, instead of the client buffering everything."""
    sent = 0
    size, total = 256 * 1024, 200  # 50 MB, far beyond loopback's socket buffers

    def handler(ws: ServerConnection) -> None:
        nonlocal sent
        for i in range(total):
            ws.send(i.to_bytes(4, "big") * (size // 4))
            sent += 1
        ws.recv()

    ws = _connect(start(handler, max_size=None), max_queue=4)
    # Time for a client that buffered everything to take it all: loopback carries the 50 MB
    # in well under this. A slower machine only makes ``sent`` smaller.
    time.sleep(1.0)
    assert sent < total // 2  # held back by TCP while nobody reads
    for i in range(total):
        msg = ws.recv()
        assert msg[:4] == i.to_bytes(4, "big") and len(msg) == size
    ws.close()


def test_a_server_that_stops_answering_pings_is_left() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []

    def serve_once() -> None:
        conn, _ = listener.accept()
        conns.append(conn)
        accept_upgrade(conn, then=b"\x82\x02hi")  # a first message in the same write; then silence

    threading.Thread(target=serve_once, daemon=True).start()
    port = listener.getsockname()[1]
    ws = _connect(f"ws://127.0.0.1:{port}/", ping_interval=0.2, ping_timeout=0.2)
    assert ws.recv() == b"hi"  # it came in the same read as the handshake's answer
    with pytest.raises(WebSocketClosed, match="keepalive"):
        _recv_within(ws, 10.0)  # a recv left waiting forever would not end
    ws.close()
    listener.close()
    for c in conns:
        c.close()


def test_close_from_another_thread_ends_a_waiting_recv(start: Callable[..., str]) -> None:
    codes: list[int | None] = []

    def handler(ws: ServerConnection) -> None:
        for _ in ws:  # until the client closes
            pass
        codes.append(ws.close_code)

    ws = _connect(start(handler))
    timer = threading.Timer(0.3, ws.close)  # most likely while recv waits (either way it ends)
    timer.start()
    with pytest.raises(WebSocketClosed):
        _recv_within(ws, 10.0)
    timer.join()
    ws.close()  # again: nothing happens
    deadline = time.monotonic() + 5
    while not codes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert codes == [1000]


def test_wss_verifies_the_server_against_the_given_ca(start: Callable[..., str], pki: Path) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki / "srv.pem", pki / "srv.key")
    url = start(lambda ws: ws.send(b"secure"), ssl=ctx)
    with pytest.raises(ssl.SSLCertVerificationError):
        _connect(url)  # the system's CAs do not know this one
    ws = _connect(url, tls=tls_context(str(pki / "ca.pem")))
    assert ws.recv() == b"secure"
    ws.close()
