"""The asyncio transport: the same pool rules as the blocking one, over asyncio streams.

``max_connections`` per endpoint (a call waits for a free one), idle expiry, and one
timeout over the whole attempt (pool wait, connect, TLS, send and the complete
response). The requests go out exactly as sent: nothing is re-sent behind the
caller's back (a queue ``get`` that deletes what it reads must never be repeated
once it may have arrived), so every retry decision stays with the SDK's core.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
import time
from collections.abc import Awaitable
from typing import TypeVar

from .._core.failures import classify
from ._shared import (
    COALESCE_MAX_BODY,
    RECV_SIZE,
    Origin,
    PoolBase,
    PoolSet,
    split_url,
)
from .base import AsyncBaseTransport, Request, Response, TransportFailure
from .http11 import ProtocolError, ResponseParser, encode_head, encode_request

__all__ = ["AsyncHTTPTransport"]

T = TypeVar("T")


class _Connection:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def close(self) -> None:
        # abort(), not close(): a TLS close would wait for the server's close_notify,
        # and a connection we drop has nothing left to send.
        with contextlib.suppress(Exception):  # already closed, or its loop is gone
            self.writer.transport.abort()

    def dropped(self) -> bool:
        return self.reader.at_eof() or self.writer.is_closing()


class _Pool(PoolBase[_Connection]):
    def __init__(self, origin: Origin, maxsize: int, expiry: float, tls: ssl.SSLContext | None) -> None:
        super().__init__(origin, expiry, tls)
        self._slots = asyncio.Semaphore(maxsize)

    async def take(self) -> _Connection | None:
        """A slot, and a usable idle connection when there is one (checking is free here)."""
        await self._slots.acquire()
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since > self.expiry or conn.dropped():
                conn.close()
                continue
            return conn
        return None

    def give_back(self, conn: _Connection | None) -> None:
        if conn is not None:
            if self.closed:
                conn.close()
            else:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
        self._slots.release()

    async def connect(self) -> _Connection:
        origin = self.origin
        reader, writer = await asyncio.open_connection(
            origin.host,
            origin.port,
            ssl=self.tls,
            server_hostname=origin.host if self.tls is not None else None,
            limit=RECV_SIZE,
        )
        return _Connection(reader, writer)

    def clear(self) -> None:
        self.closed = True
        idle = self._idle[:]
        self._idle.clear()
        for conn in idle:
            conn.close()


class _Attempt:
    """How far one attempt got (read after a failure to classify and clean up)."""

    __slots__ = ("conn", "connecting", "parser", "pool", "reused", "slot")

    def __init__(self, parser: ResponseParser) -> None:
        self.pool: _Pool | None = None
        self.conn: _Connection | None = None
        self.slot = False
        self.reused = False
        self.connecting = False
        self.parser = parser


if sys.version_info >= (3, 11):

    async def _within(aw: Awaitable[T], timeout: float) -> T:
        async with asyncio.timeout(timeout):
            return await aw

else:  # pragma: no cover - Python 3.10

    async def _within(aw: Awaitable[T], timeout: float) -> T:
        return await asyncio.wait_for(aw, timeout)


class AsyncHTTPTransport(PoolSet[_Pool], AsyncBaseTransport):
    """asyncio HTTP/1.1 transport with a connection pool per endpoint (one event loop)."""

    def _make_pool(self, origin: Origin, tls: ssl.SSLContext | None) -> _Pool:
        return _Pool(origin, self.max_connections, self.keepalive_expiry, tls)

    def _pool(self, origin_text: str) -> _Pool:
        return self._pools.get(origin_text) or self._add_pool(origin_text)

    async def _attempt(self, request: Request, target: str, st: _Attempt) -> None:
        pool = st.pool
        assert pool is not None
        conn = await pool.take()
        st.slot = True
        if conn is None:
            st.connecting = True
            conn = await pool.connect()
            st.connecting = False
        else:
            st.reused = True
        st.conn = conn
        body = request.body
        host = pool.origin.host_header
        writer = conn.writer
        if body is not None and len(body) > COALESCE_MAX_BODY:
            writer.write(encode_head(request.method, target, host, request.headers, len(body)))
            writer.write(body)
            await writer.drain()
        else:
            writer.write(encode_request(request.method, target, host, request.headers, body))
        read = conn.reader.read
        parser = st.parser
        while True:
            data = await read(RECV_SIZE)
            if not data:
                parser.feed_eof()
                return
            if parser.feed(data):
                return

    async def handle_async_request(self, request: Request) -> Response:
        parser = ResponseParser(request.method)
        st = _Attempt(parser)
        try:
            origin_text, target = split_url(request.url)
            st.pool = self._pool(origin_text)
            await _within(self._attempt(request, target, st), request.timeout)
        except BaseException as exc:
            pool = st.pool
            if st.conn is not None:
                st.conn.close()
            if st.slot and pool is not None:
                pool.give_back(None)
            if isinstance(exc, (OSError, ValueError, ProtocolError, asyncio.TimeoutError)):
                if isinstance(exc, asyncio.TimeoutError) and not isinstance(exc, TimeoutError):
                    exc = TimeoutError("timed out (attempt deadline)")  # pragma: no cover - Python 3.10
                sent = st.conn is not None
                kind = classify(exc, connecting=st.connecting) if not sent else None
                raise TransportFailure(
                    exc, kind=kind, reused=st.reused, started=parser.started, sent=sent
                ) from None
            raise
        pool = st.pool
        conn = st.conn
        assert pool is not None and conn is not None
        if parser.will_close or parser.leftover:
            conn.close()
            pool.give_back(None)
        else:
            pool.give_back(conn)
        return Response(parser.status, parser.headers, parser.body)

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.clear()
        await asyncio.sleep(0)  # let the closed transports finish closing
