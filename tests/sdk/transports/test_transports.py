"""The sync and asyncio transports against small socket servers, and MockTransport.

Both transports keep the same rules: one timeout over the whole attempt (a trickling
server cannot stretch it), ``reused``/``started``/``sent`` tell the core what a
failure means, a bad URL is final and nothing is ever re-sent by the transport.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from eas_sdk._core.retry import FailureKind
from eas_sdk._transports import (
    AsyncHTTPTransport,
    HTTPTransport,
    MockTransport,
    Request,
    Response,
    TransportFailure,
)
from eas_sdk._transports._shared import parse_origin, split_url
from tests.sdk.socket_server import ThreadedServer
from tests.waiting import async_wait_until

pytestmark = pytest.mark.timeout(30)


class Server(ThreadedServer):
    """Answers each request per ``mode``: ``ok``, ``trickle`` (a byte every 50 ms), ``drop``, ``cut``."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests = 0
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}/x"

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buf += chunk
                self.requests += 1
                try:
                    if self.mode == "drop":
                        return
                    if self.mode == "cut":
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
                        return
                    if self.mode == "trickle":
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
                        for _ in range(100):
                            time.sleep(0.05)
                            conn.sendall(b"x")
                        continue
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                except OSError:
                    return


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


class Both:
    """One transport of either kind behind an awaitable interface."""

    def __init__(self, kind: str, **kwargs: Any) -> None:
        self.kind = kind
        self.t: Any = (HTTPTransport if kind == "sync" else AsyncHTTPTransport)(**kwargs)

    async def send(self, url: str, timeout: float = 2.0) -> Response:
        req = Request("POST", url, {}, b"hi", timeout)
        if self.kind == "sync":
            return await asyncio.to_thread(self.t.handle_request, req)
        return await self.t.handle_async_request(req)

    async def close(self) -> None:
        if self.kind == "sync":
            self.t.close()
        else:
            await self.t.aclose()


@pytest.fixture(params=["sync", "async"])
async def both(request: pytest.FixtureRequest) -> Any:
    made: list[Both] = []

    def make(**kwargs: Any) -> Both:
        made.append(Both(request.param, **kwargs))
        return made[-1]

    yield make
    for b in made:
        await b.close()


def test_url_splitting() -> None:
    assert split_url("http://h:1/p?q") == ("http://h:1", "/p?q")
    assert split_url("https://h") == ("https://h", "/")
    assert split_url("http://h?q=1") == ("http://h", "/?q=1")
    assert parse_origin("http://h:80").host_header == b"h"
    assert parse_origin("https://[::1]:8443")[1:] == ("::1", 8443, b"[::1]:8443")
    for bad in ("ftp://h", "http://", "http://h:x", "http://u:p@h"):
        with pytest.raises(ValueError):
            parse_origin(bad)
    with pytest.raises(ValueError):
        split_url("h:80/path")


async def test_keep_alive_reuse_is_reported(server: Server, both: Any) -> None:
    t = both()
    assert (await t.send(server.url)).body == b"ok"
    server.mode = "drop"
    with pytest.raises(TransportFailure) as info:
        await t.send(server.url)
    assert info.value.kind is FailureKind.DISCONNECTED
    assert info.value.reused and not info.value.started and info.value.sent


async def test_a_cut_response_has_started(server: Server, both: Any) -> None:
    server.mode = "cut"
    with pytest.raises(TransportFailure) as info:
        await both().send(server.url)
    assert info.value.started and info.value.kind is FailureKind.BROKEN and not info.value.reused


async def test_trickle_is_bounded_by_the_attempt_timeout(server: Server, both: Any) -> None:
    server.mode = "trickle"
    # The trickle (5 s) never pauses as long as the timeout: only a bound on the whole
    # attempt, not one per read, ends it with a timeout.
    with pytest.raises(TransportFailure) as info:
        await both().send(server.url, timeout=0.4)
    assert info.value.kind is FailureKind.TIMEOUT and info.value.started


async def test_refused_connect_was_not_sent(both: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TransportFailure) as info:
        await both().send(f"http://127.0.0.1:{port}/x")
    assert info.value.kind is FailureKind.CONNECT and not info.value.sent


async def test_bad_url_is_fatal(both: Any) -> None:
    with pytest.raises(TransportFailure) as info:
        await both().send("gopher://h/x")
    assert info.value.kind is FailureKind.FATAL and not info.value.sent


async def test_pool_wait_counts_against_the_timeout(server: Server, both: Any) -> None:
    server.mode = "trickle"
    t = both(max_connections=1)
    # The only connection, busy with a trickle until its own timeout.
    busy = asyncio.ensure_future(t.send(server.url, timeout=2.0))
    await async_wait_until(lambda: server.requests == 1, 10, "the first request on the connection")
    # Timed out waiting for the connection: never sent (a wait that did not count against the
    # timeout would get the connection once the first call gave it up, and send).
    with pytest.raises(TransportFailure) as info:
        await t.send(server.url, timeout=0.3)
    assert info.value.kind is FailureKind.TIMEOUT and not info.value.sent
    with pytest.raises(TransportFailure):
        await busy


async def test_idle_connections_expire(server: Server, both: Any) -> None:
    t = both(keepalive_expiry=0.05)
    await t.send(server.url)
    await asyncio.sleep(0.15)  # idle for longer than the expiry
    server.mode = "drop"  # would fail as a reused connection; an expired one is not reused
    with pytest.raises(TransportFailure) as info:
        await t.send(server.url)
    assert not info.value.reused


def test_mock_transport_records_and_classifies() -> None:
    def handler(req: Request) -> Response:
        if req.url.endswith("/refuse"):
            raise ConnectionRefusedError(111, "refused")
        return Response(200, {"X": "1"}, req.body or b"")

    mock = MockTransport(handler)
    assert mock.handle_request(Request("POST", "http://h/a", {}, b"x", 1.0)).body == b"x"
    with pytest.raises(TransportFailure) as info:
        mock.handle_request(Request("GET", "http://h/refuse", {}, None, 1.0))
    assert info.value.kind is FailureKind.CONNECT and not info.value.sent
    assert [r.url for r in mock.requests] == ["http://h/a", "http://h/refuse"]


async def test_mock_transport_async_handler() -> None:
    async def handler(req: Request) -> Response:
        await asyncio.sleep(0)
        return Response(503, {}, b"busy")

    mock = MockTransport(handler)
    resp = await mock.handle_async_request(Request("GET", "http://h/", {}, None, 1.0))
    assert (resp.status, resp.body) == (503, b"busy")
    await mock.aclose()
    assert mock.closed


def test_pools_for_endpoints_that_came_and_went_are_closed() -> None:
    t = HTTPTransport()
    first = t._pool("http://h0:80")
    for i in range(1, 70):
        t._pool(f"http://h{i}:80")
    assert len(t._pools) == 64 and first.closed
    t.close()
