"""The gateway's queue fast path (gateway/fronts/fast_front.py): a real gateway app and QueueManager.

Answers from aiohttp carry its ``Server`` header; the fast path writes none, which
tells the two apart on one connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.app import create_app
from gateway.config import parse_config
from gateway.fronts.fast_front import FastSite
from gateway.fronts.server import GatewayRunner, bound_port
from tests.waiting import async_wait_until

TOKEN = "fast-front-token"
AUTH = f"Authorization: {TOKEN}\r\n"


@contextlib.asynccontextmanager
async def live(tmp_path: Path, fast: bool = True, **gateway: Any) -> AsyncIterator[tuple[GatewayRunner, int]]:
    gw = {"host": "127.0.0.1", "port": 0, "data_dir": str(tmp_path / "data"), "access_log": False}
    gw.update(gateway)
    cfg = parse_config({"gateway": gw, "services": [{"name": "q", "processor": "queue", "token": TOKEN}]})
    runner = GatewayRunner(create_app(cfg))
    await runner.setup()
    try:
        site: web.TCPSite
        if fast:
            site = FastSite(runner, "127.0.0.1", 0, conns=runner.fast_conns)
        else:
            site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield runner, bound_port(runner)
    finally:
        await runner.cleanup()


class Conn:
    """One keep-alive connection; read_response parses one Content-Length answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def call(self, head: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        self.writer.write(head.encode("latin-1") + body)
        return await self.read_response()

    async def read_response(self) -> tuple[int, dict[str, str], bytes]:
        async with asyncio.timeout(5):
            raw = await self.reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, body

    async def closed_within(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(seconds):
                while await self.reader.read(4096):
                    pass
                return True
        return False

    def close(self) -> None:
        self.writer.close()


def request_head(method: str, target: str, extra: str = "") -> str:
    return f"{method} {target} HTTP/1.1\r\nHost: x\r\n{AUTH}{extra}\r\n"


def put(body: bytes, extra: str = "") -> tuple[str, bytes]:
    return request_head("POST", "/api/predict/q", f"Content-Length: {len(body)}\r\n{extra}"), body


async def test_queue_calls_fast_and_the_rest_handed_over_on_one_connection(tmp_path: Path) -> None:
    async with live(tmp_path) as (_runner, port):
        c = await Conn.open(port)
        try:
            rid = "a" * 32
            status, h, body = await c.call(*put(b"hello", f"X-Request-Id: {rid}\r\n"))
            assert (status, body) == (200, b"1")
            assert "server" not in h  # answered by the fast path
            assert h["date"].endswith(" GMT")
            assert h["x-request-id"] == rid
            assert h["x-eas-queueservice-request-id"]
            # The head and body in separate writes (as urllib3 sends them) still take the fast
            # path; the pause (what a slow client does) makes them arrive as two reads.
            first, body2 = put(b"world")
            c.writer.write(first.encode())
            await c.writer.drain()
            await asyncio.sleep(0.05)
            c.writer.write(body2)
            status, h, body = await c.read_response()
            assert (status, body, "server" in h) == (200, b"2", False)
            status, h, body = await c.call(
                f"GET /api/predict/q?_count_=true HTTP/1.1\r\nHost: x\r\n{AUTH}\r\n"
            )
            assert (status, body, "server" in h) == (200, b"2", False)
            status, h, body = await c.call(f"GET /api/predict/q HTTP/1.1\r\nHost: x\r\n{AUTH}\r\n")
            assert status == 200 and b"hello" in body and "server" not in h
            status, h, body = await c.call(
                f"DELETE /api/predict/q?_indexes_=2 HTTP/1.1\r\nHost: x\r\n{AUTH}\r\n"
            )
            assert (status, body, "server" in h) == (200, b"OK", False)
            assert len(h["x-request-id"]) == 32
            # A token that verified before does not let another one through.
            wrong = "POST /api/predict/q HTTP/1.1\r\nHost: x\r\nAuthorization: wrong\r\n"
            wrong += "Content-Length: 1\r\n\r\nz"
            status, h, body = await c.call(wrong)
            assert (status, "server" in h, json.loads(body)["code"]) == (401, False, "Unauthorized")
            # Not a queue call: aiohttp answers it, on the same connection, with its middleware.
            status, h, body = await c.call("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 200 and "server" in h and h["x-request-id"]
            # Once handed over, the connection stays with aiohttp: queue calls still work.
            status, h, body = await c.call(*put(b"third"))
            assert (status, body, "server" in h) == (200, b"3", True)
        finally:
            c.close()
        # The figures the predict route records are kept for fast-path calls too.
        c = await Conn.open(port)
        try:
            status, _h, text = await c.call("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 200
            line = next(ln for ln in text.decode().splitlines() if ln.startswith("easgw_requests_total{") and
                        'service="q"' in ln and 'status="200"' in ln)  # fmt: skip
            assert float(line.rsplit(" ", 1)[1]) == 6.0
        finally:
            c.close()


async def test_unusual_queue_requests_go_to_aiohttp(tmp_path: Path) -> None:
    async with live(tmp_path) as (_runner, port):
        for request in (
            request_head("POST", "/api/predict/q", "Transfer-Encoding: chunked\r\n") + "1\r\nx\r\n0\r\n\r\n",
            request_head("POST", "/api/predict/q", "Content-Encoding: gzip\r\nContent-Length: 1\r\n") + "x",
            f"GET /api/predict/nope HTTP/1.1\r\nHost: x\r\n{AUTH}\r\n",
            f"GET /api/predict/q/other HTTP/1.1\r\nHost: x\r\n{AUTH}\r\n",
        ):
            c = await Conn.open(port)
            try:
                status, h, _body = await c.call(request)
                assert "server" in h, request
                assert status in (200, 404, 415), request
            finally:
                c.close()


async def test_errors_match_the_aiohttp_path(tmp_path: Path) -> None:
    """A missing or wrong token, and a queue refusal, read the same either way."""
    calls = [
        "POST /api/predict/q HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
        "POST /api/predict/q HTTP/1.1\r\nHost: x\r\nAuthorization: wrong\r\nContent-Length: 1\r\n\r\nx",
        f"PUT /api/predict/q?index=abc HTTP/1.1\r\nHost: x\r\n{AUTH}\r\n",
    ]
    seen: dict[bool, list[tuple[int, str, Any]]] = {}
    for fast in (True, False):
        async with live(tmp_path / str(fast), fast=fast) as (_runner, port):
            c = await Conn.open(port)
            out = []
            try:
                for request in calls:
                    status, h, body = await c.call(request)
                    assert ("server" in h) is not fast
                    rid = h["x-request-id"]
                    parsed: Any = body
                    if h["content-type"].startswith("application/json"):
                        parsed = json.loads(body)
                        assert parsed.pop("request_id") == rid
                    out.append((status, h["content-type"], parsed))
            finally:
                c.close()
            seen[fast] = out
    assert seen[True] == seen[False]
    assert [s for s, _, _ in seen[True]] == [401, 401, 400]


async def test_header_deadline_and_keepalive_hold_on_the_fast_path(tmp_path: Path) -> None:
    async with live(tmp_path, header_timeout_s=0.3, keepalive_timeout_s=1.0) as (_runner, port):
        c = await Conn.open(port)  # nothing at all
        assert await c.closed_within(3.0)
        c.close()
        c = await Conn.open(port)  # a request line dribbled (each byte must not extend the deadline)
        closed = asyncio.ensure_future(c.closed_within(60.0))
        give_up = time.monotonic() + 10.0  # a deadline each byte extended would never come
        for ch in b"POST /api/predict/q" + b"x" * 1000:
            if closed.done() or time.monotonic() > give_up:
                break
            c.writer.write(bytes([ch]))
            await asyncio.sleep(0.05)  # the slow client's pace
        assert closed.done() and closed.result(), "the dribbled head was never cut off"
        c.close()
        c = await Conn.open(port)  # a partial head after a served request
        try:
            status, _h, _b = await c.call(*put(b"x"))
            assert status == 200
            c.writer.write(b"GET /api/predict/q HTTP/1.1\r\nHo")
            assert await c.closed_within(3.0)
        finally:
            c.close()
        c = await Conn.open(port)  # an idle kept-alive connection: the keep-alive timeout
        try:
            sent = time.monotonic()
            status, _h, _b = await c.call(*put(b"y"))
            assert status == 200
            assert await c.closed_within(10.0)
            # Not by the header deadline (0.3 s): the keep-alive timer starts after the answer,
            # so it cannot end before 1 s from the request (a slow machine only makes it later).
            assert time.monotonic() - sent >= 0.95
        finally:
            c.close()


async def test_shutdown_answers_a_long_poll_and_closes_fast_connections(tmp_path: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        runner, port = await stack.enter_async_context(live(tmp_path))
        idle = await Conn.open(port)
        status, _h, _b = await idle.call(*put(b"x"))
        assert status == 200
        polling = await Conn.open(port)
        polling.writer.write(
            f"GET /api/predict/q?_timeout_=30&_index_=100 HTTP/1.1\r\nHost: x\r\n{AUTH}\r\n".encode()
        )
        # The long poll is parked: its connection is in the middle of a request.
        await async_wait_until(
            lambda: len(runner.fast_conns) == 2 and sum(c.busy for c in runner.fast_conns) == 1,
            10,
            "the long poll in progress",
        )
        answer = asyncio.ensure_future(polling.read_response())
        # Well before the poll's own 30 s: shutdown answers it rather than waiting it out.
        await asyncio.wait_for(stack.aclose(), 15)  # runner.cleanup()
        status, _h, _b = await asyncio.wait_for(answer, 15)
        assert status in (200, 204, 503)
        assert await idle.closed_within(5.0)
        assert await polling.closed_within(5.0)
        assert not runner.fast_conns
        idle.close()
        polling.close()


def test_the_cli_switch(tmp_path: Path) -> None:
    """``gateway serve``: ``queue_fast_path: false`` serves every call with aiohttp;
    SIGTERM stops it cleanly either way."""
    import http.client

    from tests.e2e.gateway_proc import GatewayProcess

    for fast in (True, False):
        gw: dict[str, Any] = {"access_log": False, "queue_fast_path": fast}
        cfg = {"gateway": gw, "services": [{"name": "q", "processor": "queue", "token": TOKEN}]}
        proc = GatewayProcess.start(cfg, tmp_path / str(fast))
        try:
            conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=10)
            conn.request("POST", "/api/predict/q", body=b"x", headers={"Authorization": TOKEN})
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, b"1")
            assert (resp.getheader("Server") is None) is fast
            conn.close()
        finally:
            assert proc.stop() == 0


def test_on_by_default() -> None:
    cfg = parse_config({"services": [{"name": "q", "processor": "queue", "public": True}]})
    assert cfg.gateway.queue_fast_path is True
