"""Running the application: an AppRunner whose connections have a header-phase deadline.

aiohttp has a keep-alive timeout but no deadline for receiving a request's
headers, so a client that sends half a request line (slowloris, B8) would hold
the connection until the keep-alive timer (75 s by default). Each connection
here arms a timer when it is opened, and again when bytes of a new request
arrive on a kept-alive or pipelining connection; the timer is disarmed as soon
as the parser has a complete request head. If it fires while the connection is
still waiting for a request head, the connection is closed.

Known gap: a partial head that arrives in the same read as the end of the
previous request cannot be told apart from a finished read (the C parser keeps
no visible buffer); such a connection is bounded by the keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod
from aiohttp.web import BaseRequest, StreamResponse
from aiohttp.web_protocol import RequestHandler

from gateway.errors import HTTP_STATUS_CODES
from gateway.logging import ACCESS_LOGGER, GatewayAccessLogger
from gateway.middleware import error_response, new_request_id
from gateway.state import CONFIG_KEY

if TYPE_CHECKING:
    from gateway.lean_http import FastProtocol

log = logging.getLogger("gateway.server")


class HeaderDeadlineHandler(RequestHandler):
    """RequestHandler that closes connections which do not deliver a request head in time."""

    def __init__(self, manager: web.Server, *, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout = header_timeout
        self._header_handle: asyncio.TimerHandle | None = None

    def _arm_header_deadline(self) -> None:
        if self._header_timeout > 0 and self._header_handle is None:
            self._header_handle = self._loop.call_later(self._header_timeout, self._header_deadline)

    def _disarm_header_deadline(self) -> None:
        if self._header_handle is not None:
            self._header_handle.cancel()
            self._header_handle = None

    def _header_deadline(self) -> None:
        self._header_handle = None
        if self._messages:
            return  # a complete head is queued (pipelining)
        idle = self._waiter is not None and not self._waiter.done()
        if idle or self._request_count == 0:
            peer = self.transport.get_extra_info("peername") if self.transport else None
            log.info("closing connection from %s: no request head within %.3g s", peer, self._header_timeout)
            self.force_close()
        elif self.transport is not None:
            # A handler is still busy and a partial pipelined head is waiting behind it:
            # check again later, the deadline holds once the connection is idle.
            self._arm_header_deadline()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self._disarm_header_deadline()
        elif data and not self._messages and self._receiving_next_head():
            self._arm_header_deadline()

    def _receiving_next_head(self) -> bool:
        """Bytes that complete no request are a new head (not a body) when the connection
        is idle, or when the request being handled has already received its whole body."""
        if self._waiter is not None and not self._waiter.done():
            return True
        current = self._current_request
        return current is not None and current.content.is_eof()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        """Parser rejections (bad request line, bad header): one INFO line, a JSON 4xx.

        aiohttp would log them at ERROR with the parser's message, which quotes the
        offending line (possibly an Authorization header) - so only the class is logged.
        """
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        # Non-HTTP traffic (scanners, TLS to a plain port) is common on open ports: DEBUG only.
        level = logging.DEBUG if isinstance(exc, BadHttpMethod) else logging.INFO
        log.log(level, "rejected a malformed request from %s (%s)", request.remote, type(exc).__name__)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started")
        code = HTTP_STATUS_CODES.get(status, "BadRequest")
        return error_response(status, code, "malformed HTTP request", new_request_id(), close=True)


class _GatewayServer(web.Server):
    def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout = header_timeout

    def __call__(self) -> RequestHandler:
        return HeaderDeadlineHandler(
            self, loop=self._loop, header_timeout=self._header_timeout, **self._kwargs
        )


class GatewayRunner(web.AppRunner):
    """AppRunner with the gateway's connection settings taken from the app's config."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        gw = app[CONFIG_KEY].gateway
        kwargs.setdefault("shutdown_timeout", gw.shutdown_timeout_s)
        # Cancel the handler (and so the upstream call) when the client goes away (F16).
        kwargs.setdefault("handler_cancellation", True)
        kwargs.setdefault("access_log_class", GatewayAccessLogger)
        kwargs.setdefault("access_log", logging.getLogger(ACCESS_LOGGER) if gw.access_log else None)
        super().__init__(app, **kwargs)
        self._header_timeout = gw.header_timeout_s
        # Connections still on the queue fast path (fast_front.FastSite); the ones it
        # handed to aiohttp are the web.Server's, closed by its own shutdown.
        self.fast_conns: set[FastProtocol] = set()

    async def shutdown(self) -> None:
        await super().shutdown()  # on_shutdown: the queues answer their long polls now
        if self.fast_conns:
            from gateway.lean_http import close_all

            await close_all(self.fast_conns, timeout=self._shutdown_timeout)

    async def _make_server(self) -> web.Server:
        base = await super()._make_server()
        return _GatewayServer(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=base._loop,
            header_timeout=self._header_timeout,
            **base._kwargs,
        )


def bound_port(runner: web.BaseRunner) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError("the gateway is not listening")
