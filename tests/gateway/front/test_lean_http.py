"""The lean front (gateway/lean_http): its connection state, and its protocol on a real socket."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from yarl import URL

from gateway.lean_http import (
    BODY,
    HAND_OVER,
    HEAD,
    HIGH_WATER,
    IDLE,
    MAX_HEAD,
    Connection,
    FastProtocol,
    FastRequest,
    Headers,
    Hooks,
    Limits,
    Query,
    Reply,
    parse_head,
    parse_query,
    protocol_factory,
)
from tests.waiting import async_wait_until

REQUEST = b"POST /api/predict/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"


async def _leave_mid_request(cancel_on_lost: bool) -> tuple[list[str], asyncio.Future[None]]:
    """A handler awaits a future it shares with others; the client leaves; the future resolves."""
    loop = asyncio.get_running_loop()
    shared: asyncio.Future[None] = loop.create_future()
    events: list[str] = []

    async def serve(req: FastRequest, query: Query) -> Reply:
        events.append("started")
        try:
            # Python 3.12+ runs the handler in a task, whose cancel cancels the future it
            # awaits: a future others share is awaited shielded there (the queue's long poll
            # does so). On 3.11 the front throws at the await and leaves the future alone.
            await (asyncio.shield(shared) if sys.version_info >= (3, 12) else shared)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        events.append("resumed")
        return Reply(200, b"ok")

    conns: set[FastProtocol] = set()
    server = await loop.create_server(
        protocol_factory(Hooks(serve), asyncio.Protocol, conns, Limits(1024, cancel_on_lost=cancel_on_lost)),
        "127.0.0.1",
        0,
    )
    try:
        port = server.sockets[0].getsockname()[1]
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(REQUEST)
        await async_wait_until(lambda: events, 10, "the handler to start")
        writer.close()
        await async_wait_until(lambda: not conns, 10, "the server to see the client leave")
        # A callback added after the handler's own wake-up runs after it: once it has run, a
        # handler still waiting on the shared future has resumed.
        after = loop.create_future()
        shared.add_done_callback(lambda _: after.set_result(None))
        shared.set_result(None)  # others waiting on it carry on
        await asyncio.wait_for(after, 10)
    finally:
        server.close()
    return events, shared


@pytest.mark.parametrize("cancel_on_lost", [True, False])
async def test_client_leaving_cancels_the_handler_only_when_asked(
    cancel_on_lost: bool, caplog: pytest.LogCaptureFixture
) -> None:
    events, shared = await _leave_mid_request(cancel_on_lost)
    if cancel_on_lost:
        # Cancelled at its await; the shared future was not cancelled and its late
        # completion does not resume the finished handler.
        assert events == ["started", "cancelled"]
    else:
        assert events == ["started", "resumed"]  # answered into a closed connection: dropped
    assert shared.done() and not shared.cancelled()
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_lean_http_var", default="unset")


async def test_a_handler_keeps_its_context_variables_across_an_await() -> None:
    """Each request's handler runs in a context of its own, as a Task would: what it sets
    before an await (a trace's current span) is still set after it, and no other request
    sees it."""
    loop = asyncio.get_running_loop()
    seen: list[tuple[str, str]] = []

    async def serve(req: FastRequest, query: Query) -> Reply:
        before = _VAR.get()
        _VAR.set(req.path)
        wake = loop.create_future()
        loop.call_later(0.01, wake.set_result, None)
        await wake
        seen.append((before, _VAR.get()))
        return Reply(200, b"ok")

    conns: set[FastProtocol] = set()
    server = await loop.create_server(
        protocol_factory(Hooks(serve), asyncio.Protocol, conns, Limits(1024)), "127.0.0.1", 0
    )
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for path in ("/api/predict/a", "/api/predict/b"):
            writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
            await asyncio.wait_for(reader.readuntil(b"ok"), 10)
        writer.close()
    finally:
        server.close()
    assert seen == [("unset", "/api/predict/a"), ("unset", "/api/predict/b")]


@pytest.mark.parametrize(
    "qs",
    [
        "", "a=1&b=2", "_attrs_", "a=&b", "a=1&&b=2", "a+b=c%2Cd", "_indexes_=1%2C2", "k=%E4%B8%AD", "x=1=2",
        "_indexes_=1%2C2%2C3&x=%2C", "a=%2c", "a=%252C", "%2C=1",
    ],
)  # fmt: skip
def test_parse_query_matches_yarl(qs: str) -> None:
    assert parse_query(qs) == list(URL("/p?" + qs).query.items())


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="a=&%2Cc5+,", max_size=16))
def test_parse_query_unquotes_as_the_standard_library(qs: str) -> None:
    assert parse_query(qs) == urllib.parse.parse_qsl(qs, keep_blank_values=True)


def test_parse_head_hands_over_what_it_does_not_implement() -> None:
    ok = parse_head(
        b"PUT /api/predict/q?_indexes_=1 HTTP/1.1\r\nContent-length: 0\r\nX-A:  b \r\nX-B:\tc \t\r\n\r\n", 100
    )
    assert ok is not None
    assert (ok.method, ok.path, ok.query) == ("PUT", "/api/predict/q", "_indexes_=1")
    assert ok.clen == 0 and not ok.close
    headers = ok.headers
    assert isinstance(headers, Headers) and headers.get("x-a") == "b" and headers["CONTENT-LENGTH"] == "0"
    assert headers["x-b"] == "c"  # spaces and tabs around a value are not part of it
    dup = parse_head(b"GET /api/predict/q HTTP/1.1\r\nX-A: first\r\nx-a: second\r\nHost: h\r\n\r\n", 100)
    assert dup is not None and dup.headers.get("X-A") == "first" and dup.headers.get("host") == "h"
    closing = parse_head(b"GET /api/predict/q HTTP/1.1\r\nConnection: close\r\n\r\n", 100)
    assert closing is not None and closing.close
    for head in (
        b"GET /api/predict/q HTTP/1.0\r\nHost: x",
        b"PATCH /api/predict/q HTTP/1.1\r\nHost: x",
        b"GET /api/predict/q%2Fx HTTP/1.1\r\nHost: x",
        b"GET /api/predict/ HTTP/1.1\r\nHost: x",
        b"GET /other HTTP/1.1\r\nHost: x",
        b"GET /api/predict/q HTTP/1.1\r\nUpgrade: websocket",
        b"POST /api/predict/q HTTP/1.1\r\nTransfer-Encoding: chunked",
        b"POST /api/predict/q HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6",
        b"POST /api/predict/q HTTP/1.1\r\nContent-Length: -1",
        b"POST /api/predict/q HTTP/1.1\r\nContent-Length: 101",
        b"POST /api/predict/q HTTP/1.1\r\nExpect: 100-continue",
        b"GET /api/predict/q HTTP/1.1\r\nno colon here",
        b"GET /api/predict/q HTTP/1.1\r\n folded: x",
        b"GET /api/predict/q HTTP/1.1\r\nX: a\r\n  folded",
        b"GET /api/predict/q HTTP/1.1\nHost: x\n",  # bare LF line ends
        b"\r\nGET /api/predict/q HTTP/1.1\r\nHost: x",  # a blank line first
        b"GET /api/predict/q HTTP/1.1\r\nX-Long: " + b"a" * 9000,
    ):
        assert parse_head(head + b"\r\n\r\n", 100) is None, head


REQ = b"POST /api/predict/q HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"


def test_connection_yields_pipelined_requests_one_at_a_time() -> None:
    conn = Connection(100, remote="1.2.3.4")
    assert conn.next() == IDLE
    conn.receive(REQ[:10])
    assert conn.next() == HEAD
    conn.receive(REQ[10:-2])
    assert conn.next() == BODY
    pending = conn.pending()
    assert pending is not None and pending[1] == 2
    assert pending[0].body == b"" and pending[0].path == "/api/predict/q"
    chunked = b"POST /api/predict/q HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    conn.receive(REQ[-2:] + REQ + chunked)  # the rest, a second request, then one to hand over
    first = conn.next()
    assert isinstance(first, tuple)
    req, query, close = first
    assert req.body == b"abc" and req.remote == "1.2.3.4" and req.content_length == 3
    assert query == [] and not close
    second = conn.next()
    assert isinstance(second, tuple) and second[0].body == b"abc" and second[0] is not req
    assert conn.next() == HAND_OVER
    assert bytes(conn.buf) == chunked  # every byte of the request handed over is still there


def test_connection_hands_over_what_accept_refuses_and_a_malformed_head() -> None:
    seen: list[tuple[str, str, int]] = []

    def accept(method: str, path: str, headers: Headers, clen: int) -> bool:
        seen.append((method, path, clen))
        return path.endswith("/yes")

    conn = Connection(100, accept)
    yes, no = REQ.replace(b"/q ", b"/yes "), REQ.replace(b"/q ", b"/no ")
    conn.receive(yes + no)
    assert isinstance(conn.next(), tuple)
    assert conn.next() == HAND_OVER and bytes(conn.buf) == no
    assert seen == [("POST", "/api/predict/yes", 3), ("POST", "/api/predict/no", 3)]
    # V2 inference paths are considered too; other targets never reach ``accept``.
    v2 = Connection(100, accept)
    v2.receive(
        REQ.replace(b"/api/predict/q ", b"/v2/models/m/infer ") + REQ.replace(b"/api/predict/q ", b"/v1/m ")
    )
    assert v2.next() == HAND_OVER
    assert seen[-1] == ("POST", "/v2/models/m/infer", 3)
    assert not any(path == "/v1/m" for _, path, _ in seen)
    bad = Connection(100)
    bad.receive(b"GET /api/predict/q HTTP/1.1\r\nBad Header: x\r\n\r\n")
    assert bad.next() == HAND_OVER and bytes(bad.buf).startswith(b"GET /api/predict/q")
    big = Connection(100)
    big.receive(b"GET /api/predict/q HTTP/1.1\r\nX: " + b"a" * MAX_HEAD)
    assert big.next() == HAND_OVER


class _Transport:
    """Just enough of a transport for FastProtocol."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.reading = True
        self.closed = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def answers(self) -> int:
        """How many answers were written (several may go in one write)."""
        return b"".join(self.written).count(b"HTTP/1.1 ")


async def test_flow_control_pauses_a_client_that_runs_ahead() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()

    async def serve(req: FastRequest, query: Query) -> Reply:
        await gate
        return Reply(200, req.body)

    proto = protocol_factory(Hooks(serve), asyncio.Protocol, set(), Limits(1 << 20))()
    t = _Transport()
    proto.connection_made(t)  # type: ignore[arg-type]
    proto.data_received(REQ)  # the handler waits on the gate
    proto.data_received(REQ * (HIGH_WATER // len(REQ) + 1))  # pipelined far ahead
    assert not t.reading and not t.written
    gate.set_result(None)
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the answers of a loop turn are written at its end
    assert t.reading and t.answers() == HIGH_WATER // len(REQ) + 2
    # A client that does not read its answers: nothing more is answered until it does.
    proto.pause_writing()
    proto.data_received(REQ)
    await asyncio.sleep(0)
    assert t.answers() == HIGH_WATER // len(REQ) + 2
    proto.resume_writing()
    await asyncio.sleep(0)
    assert t.answers() == HIGH_WATER // len(REQ) + 3 and not t.closed
