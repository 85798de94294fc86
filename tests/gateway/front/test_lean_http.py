"""FastProtocol (gateway/lean_http.py) on a real socket: cancellation when the client leaves."""

from __future__ import annotations

import asyncio

import pytest

from gateway.lean_http import FastProtocol, FastRequest, Query, Reply

REQUEST = b"POST /api/predict/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"


async def _leave_mid_request(cancel_on_lost: bool) -> tuple[list[str], asyncio.Future[None]]:
    """A handler awaits a future it shares with others; the client leaves; the future resolves."""
    loop = asyncio.get_running_loop()
    shared: asyncio.Future[None] = loop.create_future()
    events: list[str] = []

    async def serve(req: FastRequest, query: Query) -> Reply:
        events.append("started")
        try:
            await shared
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        events.append("resumed")
        return Reply(200, b"ok")

    conns: set[FastProtocol] = set()
    server = await loop.create_server(
        lambda: FastProtocol(serve, asyncio.Protocol, conns, 1024, cancel_on_lost=cancel_on_lost),
        "127.0.0.1",
        0,
    )
    try:
        port = server.sockets[0].getsockname()[1]
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(REQUEST)
        for _ in range(100):
            if events:
                break
            await asyncio.sleep(0.01)
        writer.close()
        await asyncio.sleep(0.2)
        shared.set_result(None)  # others waiting on it carry on
        await asyncio.sleep(0.05)
        assert not conns
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
