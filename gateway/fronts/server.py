"""Running the application: an AppRunner whose connections have a request-head deadline.

aiohttp has a keep-alive timeout but no deadline for receiving a request's head, and it
logs a malformed request at ERROR quoting the offending line (possibly an Authorization
header). Every connection aiohttp serves here, whether from a plain ``TCPSite`` or handed
over by the lean front (gateway/fronts/fast_front.py), is therefore wrapped in
``lean_http.HeadWatch``: a request head must be complete within ``header_timeout_s``
(slowloris), and a malformed first request gets the gateway's JSON 400 and one INFO line
naming only the kind of error. Only aiohttp's public API is used: the runner's ``server``
(the protocol factory that sites listen with) and the protocol's ``close()``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, cast

import httptools
from aiohttp import web

from eas_sdk._core.constants import HEADER_REQUEST_ID
from gateway.core.logs import ACCESS_LOGGER, GatewayAccessLogger
from gateway.fronts.state import GATEWAY_KEY
from gateway.http.middleware import new_request_id
from gateway.lean_http import Reply, close_all, encode_reply
from gateway.lean_http.watch import HeadWatch

if TYPE_CHECKING:
    from gateway.core.admission import Admission
    from gateway.lean_http import FastProtocol

log = logging.getLogger("gateway.server")

_JSON = "application/json; charset=utf-8"


def malformed_reply(remote: str | None, exc: Exception) -> bytes:
    """The answer to a request the HTTP parser refuses: a JSON 400 ``BadRequest``, logged
    as one line that names only the kind of error (the line itself could hold a token)."""
    # Non-HTTP traffic (scanners, TLS to a plain port) is common on open ports: DEBUG only.
    level = logging.DEBUG if isinstance(exc, httptools.HttpParserInvalidMethodError) else logging.INFO
    log.log(level, "rejected a malformed request from %s (%s)", remote, type(exc).__name__)
    rid = new_request_id()
    body = json.dumps({"code": "BadRequest", "message": "malformed HTTP request", "request_id": rid})
    return encode_reply(Reply(400, body.encode(), _JSON, {HEADER_REQUEST_ID: rid}), close=True)


class Refused(asyncio.Protocol):
    """A connection past ``gateway.max_connections``: answered 503 at once and closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        rid = new_request_id()
        doc = {
            "code": "ServiceNotReady",
            "message": "the gateway has too many open connections",
            "request_id": rid,
        }
        headers = {HEADER_REQUEST_ID: rid, "Retry-After": "1"}
        reply = Reply(503, json.dumps(doc).encode(), _JSON, headers)
        cast(asyncio.Transport, transport).write(encode_reply(reply, close=True))
        transport.close()


class WatchedServer:
    """aiohttp's ``web.Server`` (the protocol factory) with every connection in a HeadWatch,
    past the admission's connection limit refused; anything else is the wrapped server's."""

    def __init__(self, server: web.Server, header_timeout: float, admission: Admission | None = None) -> None:
        self.server = server
        self.header_timeout = header_timeout
        self.admission = admission

    def __call__(self) -> asyncio.Protocol:
        if self.admission is not None and not self.admission.admit_connection():
            return Refused()
        return HeadWatch(self.server(), self.header_timeout, malformed_reply)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)


class GatewayRunner(web.AppRunner):
    """AppRunner with the gateway's connection settings taken from the app's config."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        gw = app[GATEWAY_KEY].config.gateway
        kwargs.setdefault("shutdown_timeout", gw.shutdown_timeout_s)
        # Cancel the handler (and so the upstream call) when the client goes away.
        kwargs.setdefault("handler_cancellation", True)
        kwargs.setdefault("access_log_class", GatewayAccessLogger)
        kwargs.setdefault("access_log", logging.getLogger(ACCESS_LOGGER) if gw.access_log else None)
        super().__init__(app, **kwargs)
        self.close_timeout: float = kwargs["shutdown_timeout"]
        self._header_timeout = gw.header_timeout_s
        # Connections still on the fast path (fast_front.FastSite); the ones it handed to
        # aiohttp are the web.Server's, closed by its own shutdown.
        self.fast_conns: set[FastProtocol] = set()

    @property
    def server(self) -> web.Server | None:
        """What sites listen with (and the lean front hands connections to)."""
        server = super().server
        if server is None:
            return None
        admission = (
            self.app[GATEWAY_KEY].dataplane.admission if isinstance(self.app, web.Application) else None
        )
        if admission is not None:
            # Every connection: those on the fast path and those aiohttp serves.
            fast = self.fast_conns
            admission.open_connections = lambda: len(fast) + len(server.connections)
        return WatchedServer(server, self._header_timeout, admission)  # type: ignore[return-value]

    async def shutdown(self) -> None:
        await super().shutdown()  # on_shutdown: the queues answer their long polls now
        if self.fast_conns:
            await close_all(self.fast_conns, timeout=self.close_timeout)


def bound_port(runner: web.BaseRunner) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError("the gateway is not listening")
