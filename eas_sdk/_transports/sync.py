"""The blocking transport: a keep-alive connection pool per endpoint over plain sockets.

* ``max_connections`` per endpoint (host and port), never more: a call waits for a
  free one, and that wait counts against the attempt's timeout.
* A connection idle longer than ``keepalive_expiry`` is closed instead of reused
  (servers close idle ones: reusing one they are closing right now fails the call).
* The attempt's ``timeout`` bounds all of it: pool wait, connect, TLS handshake,
  send and every read, so a server that trickles its answer cannot hold a call
  longer (each socket operation waits only for what is left of the attempt).
* https is verified (the system CAs, or ``ca_certs``).
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time

from .._core.failures import FailureKind, classify
from ._shared import (
    COALESCE_MAX_BODY,
    RECV_SIZE,
    Origin,
    PoolBase,
    PoolSet,
    split_url,
)
from .base import BaseTransport, Request, Response, TransportFailure
from .http11 import ProtocolError, ResponseParser, encode_head, encode_request

__all__ = ["HTTPTransport"]


class _Connection:
    __slots__ = ("idle_since", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.idle_since = 0.0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _dropped(sock: socket.socket) -> bool:
    """Whether an idle socket is readable: closed by the server (or it sent something unasked)."""
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class _Pool(PoolBase[_Connection]):
    """Connections to one origin: at most ``maxsize`` open, idle ones reused last-in first-out."""

    def __init__(self, origin: Origin, maxsize: int, expiry: float, tls: ssl.SSLContext | None) -> None:
        super().__init__(origin, expiry, tls)
        self._slots = threading.BoundedSemaphore(maxsize)
        self._lock = threading.Lock()

    def take(self, deadline: float, check_dropped: bool) -> _Connection | None:
        """A slot, and an idle connection when there is a usable one (None: open a new one)."""
        if not self._slots.acquire(blocking=False):
            left = deadline - time.monotonic()
            if left <= 0 or not self._slots.acquire(timeout=left):
                raise TimeoutError("timed out waiting for a free pooled connection")
        now = time.monotonic()
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return None
            if now - conn.idle_since > self.expiry or (check_dropped and _dropped(conn.sock)):
                conn.close()
                continue
            return conn

    def give_back(self, conn: _Connection | None) -> None:
        if conn is not None:
            conn.idle_since = time.monotonic()
            with self._lock:
                if not self.closed:
                    self._idle.append(conn)
                    conn = None
            if conn is not None:
                conn.close()
        self._slots.release()

    def connect(self, deadline: float) -> _Connection:
        origin = self.origin
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out before connecting")
        sock = socket.create_connection((origin.host, origin.port), timeout=left)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock = self.tls.wrap_socket(sock, server_hostname=origin.host)
        except BaseException:
            sock.close()
            raise
        return _Connection(sock)

    def clear(self) -> None:
        with self._lock:
            self.closed = True
            idle = self._idle[:]
            self._idle.clear()
        for conn in idle:
            conn.close()


def _exchange(
    conn: _Connection, request: Request, target: str, host: bytes, deadline: float, parser: ResponseParser
) -> None:
    """Send the request and read the whole response, each step within what is left of the attempt."""
    sock = conn.sock
    body = request.body
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out before sending")
    sock.settimeout(left)
    if body is not None and len(body) > COALESCE_MAX_BODY:
        sock.sendall(encode_head(request.method, target, host, request.headers, len(body)))
        sock.sendall(body)  # not copied into one buffer with the head
    else:
        sock.sendall(encode_request(request.method, target, host, request.headers, body))
    recv = sock.recv
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out (attempt deadline)")
        sock.settimeout(left)
        data = recv(RECV_SIZE)
        if not data:
            parser.feed_eof()
            return
        if parser.feed(data):
            return


class HTTPTransport(PoolSet[_Pool], BaseTransport):
    """Blocking HTTP/1.1 transport with a connection pool per endpoint (thread-safe)."""

    def _make_pool(self, origin: Origin, tls: ssl.SSLContext | None) -> _Pool:
        return _Pool(origin, self.max_connections, self.keepalive_expiry, tls)

    def _pool(self, origin_text: str) -> _Pool:
        pool = self._pools.get(origin_text)
        if pool is None:
            with self._lock:
                pool = self._pools.get(origin_text) or self._add_pool(origin_text)
        return pool

    def handle_request(self, request: Request) -> Response:
        deadline = time.monotonic() + request.timeout
        try:
            origin_text, target = split_url(request.url)
            pool = self._pool(origin_text)
            conn = pool.take(deadline, not request.idempotent)
        except (OSError, ValueError) as exc:
            raise TransportFailure(exc, sent=False) from None
        reused = conn is not None
        if conn is None:
            try:
                conn = pool.connect(deadline)
            except BaseException as exc:
                pool.give_back(None)
                if isinstance(exc, (OSError, ValueError)):
                    raise TransportFailure(exc, kind=_connect_kind(exc), sent=False) from None
                raise
        parser = ResponseParser(request.method)
        try:
            _exchange(conn, request, target, pool.origin.host_header, deadline, parser)
        except BaseException as exc:
            conn.close()
            pool.give_back(None)
            if isinstance(exc, (OSError, ValueError, ProtocolError)):
                raise TransportFailure(exc, reused=reused, started=parser.started) from None
            raise
        if parser.will_close or parser.leftover:
            conn.close()
            pool.give_back(None)
        else:
            pool.give_back(conn)
        return Response(parser.status, parser.headers, parser.body)

    def close(self) -> None:
        """Close every pooled connection (those in use close when their call ends).

        The transport stays usable: a later request opens new connections.
        """
        with self._lock:
            pools = list(self._pools.values())
            self._pools = {}
        for pool in pools:
            pool.clear()


def _connect_kind(exc: BaseException) -> FailureKind:
    return classify(exc, connecting=True)
