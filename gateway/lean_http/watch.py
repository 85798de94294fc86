"""A request-head deadline and a clean 400 for connections that aiohttp serves.

aiohttp has a keep-alive timeout but no deadline for receiving a request's head, so a
client that sends half a request line (slowloris) would hold the connection until the
keep-alive timer (75 s by default). :class:`HeadWatch` sits between the transport and
aiohttp's protocol for one connection, passes every byte and callback on, and follows the
byte stream with its own httptools parser (it reads nothing of aiohttp's state): a timer
runs from the connection's start, and from the first byte of each later request, until
that request's head is complete. When it fires, the connection is closed: at once when no
request was received yet, else through aiohttp's graceful ``close()`` (a request still
being answered gets its answer, then the connection closes), and for sure when the
deadline passes a second time.

A request that the parser refuses is answered by ``refuse`` (the gateway's JSON 400) and
the connection closes, without the bytes reaching aiohttp, which would log the offending
line at ERROR. Like aiohttp's own answer to a parse error, this does not wait for an
earlier pipelined request still being answered (a client that pipelines a malformed
request loses the answers behind it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol, cast

import httptools

log = logging.getLogger("gateway.server")

# aiohttp refuses a request line or header field longer than this (its default limits).
MAX_LINE = 8190


class _Closable(Protocol):
    """aiohttp's protocol for one connection (``web.Server()``'s product)."""

    def close(self) -> None: ...  # finish the request in progress, then close


Refuse = Callable[[str | None, Exception], bytes]


class _TooLong(Exception):
    """A request line or header field over aiohttp's limit (aiohttp answers it 400)."""


class HeadWatch(asyncio.Protocol):
    """Wraps aiohttp's protocol ``inner`` for one connection (see the module docstring)."""

    def __init__(self, inner: asyncio.Protocol, header_timeout: float, refuse: Refuse | None = None) -> None:
        self._inner = inner
        self._timeout = header_timeout
        self._refuse = refuse
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._url_len = 0
        self._requests = 0  # request heads completed on this connection
        self._remote: str | None = None
        self._closing = False  # the deadline passed once on a kept-alive connection
        self._partial = False  # a request head has begun and is not complete

    # ------------------------------------------------------------------ passed on
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, (tuple, list)) and peer:
            self._remote = str(peer[0])
        self._inner.connection_made(transport)
        self._arm()  # the first head is due within the deadline too

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        self._transport = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is not None:
            try:
                parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self._stop_watching()  # no longer HTTP/1.1 (a WebSocket): aiohttp's alone
            except httptools.HttpParserError as exc:
                self._stop_watching()
                cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else exc
                if self._refuse is not None and isinstance(cause, Exception):
                    self._answer_malformed(cause)
                    return
        self._inner.data_received(data)

    # ------------------------------------------------------------------ the parser's callbacks
    def on_message_begin(self) -> None:
        self._url_len = 0
        self._partial = True
        self._arm()

    def on_url(self, url: bytes) -> None:
        self._url_len += len(url)
        if self._url_len > MAX_LINE:
            raise _TooLong("request line")

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) > MAX_LINE or len(value) > MAX_LINE:
            raise _TooLong("header")

    def on_headers_complete(self) -> None:
        self._requests += 1
        self._partial = False
        self._disarm()

    # ------------------------------------------------------------------ the deadline
    def _arm(self) -> None:
        if self._timer is None and self._timeout > 0 and self._transport is not None:
            self._timer = asyncio.get_running_loop().call_later(self._timeout, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _stop_watching(self) -> None:
        self._parser = None
        self._disarm()

    def _expired(self) -> None:
        self._timer = None
        t = self._transport
        if t is None:
            return
        if self._requests == 0 or self._closing:
            # An idle connection (no head begun) is routine: DEBUG; a head left half-sent, INFO.
            level = logging.INFO if self._partial else logging.DEBUG
            log.log(
                level,
                "closing connection from %s: no request head within %.3g s",
                self._remote,
                self._timeout,
            )
            t.close()
            return
        # A kept-alive connection: aiohttp may still be answering an earlier request, and
        # its close() lets that answer out first, then closes. aiohttp tells nobody whether
        # it is busy, and close() does not close an idle connection, so the connection is
        # closed for sure one more deadline later.
        self._closing = True
        cast(_Closable, self._inner).close()
        self._arm()

    def _answer_malformed(self, exc: Exception) -> None:
        t = self._transport
        assert t is not None and self._refuse is not None
        t.write(self._refuse(self._remote, exc))
        t.close()
