"""gateway/fronts/server.py and lean_http.watch: what aiohttp serves keeps the gateway's head
deadline and answers a malformed request with the gateway's JSON 400."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp import web

from gateway.fronts.server import GatewayRunner, WatchedServer
from gateway.fronts.state import GATEWAY_KEY
from gateway.lean_http.watch import HeadWatch
from tests.gateway.front.fakes import close_writer, live_gateway, raw_request

pytestmark = pytest.mark.usefixtures("front")  # both listeners: see conftest.py

SECRET = "Authorization: secret-token-in-a-bad-line"


async def test_a_malformed_request_is_a_json_400_logged_without_its_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with live_gateway() as gw:
        for bad in (
            f"GET /healthz HTTP/1.1\r\nHost: x\r\n{SECRET}\r\n folded\r\n\r\n",
            f"POST /api/predict/echo HTTP/1.1\r\n{SECRET}\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",
            f"GET /healthz HTTP/1.1\r\nX-Long: {'a' * 9000}\r\n\r\n",
        ):
            data = await raw_request(gw.port, bad.encode())
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400") and b"Connection: close" in head, data[:200]
            payload = json.loads(body)
            assert payload["code"] == "BadRequest" and payload["request_id"]
    assert "secret-token" not in caplog.text
    assert "rejected a malformed request" in caplog.text


async def test_a_malformed_request_on_a_kept_alive_connection_is_a_json_400() -> None:
    async with live_gateway() as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            first = await asyncio.wait_for(reader.readuntil(b'"ok"}'), 3.0)
            writer.write(f"GET /healthz HTTP/1.1\r\n{SECRET}\r\nBad Header: x\r\n\r\n".encode())
            data = await asyncio.wait_for(reader.read(), 5.0)  # until the server closes
        finally:
            await close_writer(writer)
        assert first.startswith(b"HTTP/1.1 200")
        assert data.startswith(b"HTTP/1.1 400") and b'"BadRequest"' in data, data[:300]


def test_the_runner_listens_with_a_watched_server() -> None:
    """The one thing of aiohttp this relies on beyond ``BaseRunner.server``: the protocol
    a ``web.Server`` makes has a graceful ``close()``."""

    async def handler(request: web.BaseRequest) -> web.Response:
        return web.Response()

    async def check() -> None:
        server = web.Server(handler)
        watched = WatchedServer(server, 1.0)
        proto = watched()
        assert isinstance(proto, HeadWatch)
        assert callable(getattr(server(), "close", None))
        assert watched.connections == server.connections  # the rest is the server's
        await server.shutdown()

    asyncio.run(check())
    assert isinstance(GatewayRunner.server, property)


async def test_connections_past_the_limit_are_refused_with_503() -> None:
    async with live_gateway(max_connections=3) as gw:
        conns = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(5)]
        try:
            answers = []
            for reader, _writer in conns:
                try:
                    answers.append(await asyncio.wait_for(reader.read(4096), 0.3))
                except asyncio.TimeoutError:
                    answers.append(b"")  # admitted: waits for a request
            refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
            assert len(refused) == 2, answers
            assert b'"code": "ServiceNotReady"' in refused[0] and b"Retry-After: 1" in refused[0]
            snap = gw.app[GATEWAY_KEY].dataplane.admission.snapshot()
            assert snap["connections"] == 3 and snap["refused"]["connections"] == 2
        finally:
            for _reader, writer in conns:
                await close_writer(writer)
