"""A blocking WebSocket client connection for the queue watcher, on ``websockets``' sans-I/O
``ClientProtocol``.

One reader thread per connection reads the socket, lets the protocol parse the frames and
queues whole messages; the consumer takes them from a deque and waits on a condition only
when none is buffered. The library's own threaded client takes two locks and a condition
per message, about a third of a watcher's CPU when records stream at 100k/s.

The reader also answers pings (the protocol queues each pong), pings the server every
``ping_interval`` and drops the connection when a pong is ``ping_timeout`` late, and stops
reading while ``max_queue`` messages wait, so that TCP slows the server down instead of the
client buffering without bound. It does not ping while it waits for the consumer: the
connection is known to be alive then, and a pong could not be read anyway.
"""

from __future__ import annotations

import collections
import os
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Any

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidMessage
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

_READ_SIZE = 256 * 1024


class WebSocketClosed(ConnectionError):
    """The connection ended: closed by either side, dropped, or timed out by the keepalive."""


class SyncWebSocket:
    """A connected WebSocket (see the module docstring); :meth:`connect` opens one."""

    def __init__(
        self,
        sock: socket.socket,
        protocol: ClientProtocol,
        *,
        ping_interval: float | None,
        ping_timeout: float | None,
        max_queue: int,
        close_timeout: float,
        early: Sequence[Any] = (),
    ) -> None:
        self._sock = sock
        self._protocol = protocol
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._high = max(1, max_queue)
        self._low = self._high // 4
        self._close_timeout = close_timeout
        self._messages: collections.deque[bytes | str] = collections.deque()
        self._fragments: list[bytes] = []
        self._fragment_text = False
        # Guards the protocol and the socket's sends, used by the reader and by close().
        self._lock = threading.Lock()
        self._ready = threading.Condition()
        self._consumer_waits = False
        self._reader_waits = False
        self._closing = False
        self._ended = threading.Event()
        self._error: BaseException | None = None
        self._deliver(early)
        self._reader = threading.Thread(target=self._read, name="eas-watch-reader", daemon=True)
        self._reader.start()

    @classmethod
    def connect(
        cls,
        url: str,
        headers: dict[str, str],
        *,
        open_timeout: float,
        ping_interval: float | None = None,
        ping_timeout: float | None = None,
        max_queue: int = 4096,
        close_timeout: float = 1.0,
        tls: ssl.SSLContext | None = None,
    ) -> SyncWebSocket:
        """Open the TCP (and TLS, for ``wss://``) connection and complete the handshake within
        ``open_timeout``. A refused upgrade raises the protocol's ``InvalidStatus``, whose
        response carries the server's status, headers and body."""
        uri = parse_uri(url)
        deadline = time.monotonic() + open_timeout
        sock = socket.create_connection((uri.host, uri.port), timeout=open_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if uri.secure:
                context = tls or ssl.create_default_context()
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                sock = context.wrap_socket(sock, server_hostname=uri.host)
            protocol = ClientProtocol(uri, max_size=None)
            request = protocol.connect()
            request.headers.update(headers)
            protocol.send_request(request)
            for data in protocol.data_to_send():
                sock.sendall(data)
            events: list[Any] = []
            while not events:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                data = sock.recv(65536)
                if data:
                    protocol.receive_data(data)
                else:
                    protocol.receive_eof()
                events = protocol.events_received()
                if not data and not events:
                    raise InvalidMessage("the connection closed during the handshake")
            if protocol.handshake_exc is not None:
                raise protocol.handshake_exc
            for data in protocol.data_to_send():
                sock.sendall(data)  # e.g. the pong to a ping that came with the answer
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        # Frames that came in the same read as the handshake's answer are delivered first.
        return cls(
            sock, protocol, ping_interval=ping_interval, ping_timeout=ping_timeout,
            max_queue=max_queue, close_timeout=close_timeout, early=events[1:],
        )  # fmt: skip

    # ------------------------------------------------------------------ consumer side
    def recv(self) -> bytes | str:
        """The next message (bytes, or str for a text frame); raises WebSocketClosed once the
        connection has ended and every message received before that was taken."""
        messages = self._messages
        while True:
            if messages:
                msg = messages.popleft()
                if self._reader_waits and len(messages) <= self._low:
                    with self._ready:
                        self._ready.notify_all()
                return msg
            with self._ready:
                self._consumer_waits = True
                # Checked again under the lock: the reader notifies only a consumer that waits.
                while not messages and not self._ended.is_set():
                    self._ready.wait()
                self._consumer_waits = False
            if not messages:
                raise WebSocketClosed(self._reason())

    def close(self) -> None:
        """Send a close frame, give the server ``close_timeout`` to answer it, then drop the
        connection. Safe from any thread, and more than once."""
        with self._lock:
            first = not self._closing
            self._closing = True
            if first and self._protocol.state is State.OPEN:
                self._protocol.send_close(1000)
                try:
                    self._send_pending()
                except OSError:
                    pass  # the connection is gone or stuck: it is dropped below either way
        with self._ready:
            self._ready.notify_all()  # a reader paused for the consumer reads on to the end
        if threading.current_thread() is not self._reader:
            self._ended.wait(self._close_timeout)
        self._shutdown()
        if threading.current_thread() is not self._reader:
            self._reader.join(self._close_timeout)

    # ------------------------------------------------------------------ reader thread
    def _read(self) -> None:
        sock, protocol = self._sock, self._protocol
        ping_at = self._next_ping()
        pong_by: float | None = None
        token = b""
        try:
            while True:
                now = time.monotonic()
                if pong_by is not None and now >= pong_by:
                    raise WebSocketClosed("no answer to the keepalive ping")
                if ping_at is not None and pong_by is None and now >= ping_at:
                    token = os.urandom(4)
                    with self._lock:
                        protocol.send_ping(token)
                        self._send_pending()
                    ping_at = self._next_ping()
                    pong_by = None if self._ping_timeout is None else now + self._ping_timeout
                wake = [t for t in (ping_at, pong_by) if t is not None]
                sock.settimeout(max(0.001, min(wake) - now) if wake else None)
                try:
                    data = sock.recv(_READ_SIZE)
                except TimeoutError:
                    continue  # a keepalive step is due
                with self._lock:
                    if data:
                        protocol.receive_data(data)
                    else:
                        protocol.receive_eof()
                    events = protocol.events_received()
                    self._send_pending()  # pongs, the answer to a close frame
                for event in events:
                    if isinstance(event, Frame) and event.opcode is Opcode.PONG and event.data == token:
                        pong_by = None
                self._deliver(events)
                if not data or protocol.state is State.CLOSED:
                    return
                if len(self._messages) >= self._high:
                    self._wait_for_consumer()
                    ping_at, pong_by = self._next_ping(), None
        except Exception as exc:  # whatever ends the reader ends the connection, for recv to raise
            self._error = exc
        finally:
            self._ended.set()
            with self._ready:
                self._ready.notify_all()

    def _deliver(self, events: Sequence[Any]) -> None:
        messages = self._messages
        delivered = False
        for event in events:
            if not isinstance(event, Frame):
                continue
            opcode = event.opcode
            if opcode is Opcode.BINARY or opcode is Opcode.TEXT:
                if event.fin:
                    data = bytes(event.data)
                    messages.append(data.decode() if opcode is Opcode.TEXT else data)
                    delivered = True
                else:
                    self._fragments = [bytes(event.data)]
                    self._fragment_text = opcode is Opcode.TEXT
            elif opcode is Opcode.CONT:
                self._fragments.append(bytes(event.data))
                if event.fin:
                    data = b"".join(self._fragments)
                    self._fragments = []
                    messages.append(data.decode() if self._fragment_text else data)
                    delivered = True
        if delivered and self._consumer_waits:
            with self._ready:
                self._ready.notify_all()

    def _wait_for_consumer(self) -> None:
        with self._ready:
            self._reader_waits = True
            while len(self._messages) > self._low and not self._closing:
                self._ready.wait()
            self._reader_waits = False

    def _next_ping(self) -> float | None:
        return None if self._ping_interval is None else time.monotonic() + self._ping_interval

    def _send_pending(self) -> None:
        # Called with self._lock held.
        for data in self._protocol.data_to_send():
            if data:
                self._sock.sendall(data)

    def _shutdown(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone
        self._sock.close()

    def _reason(self) -> str:
        if self._error is not None:
            return str(self._error) or type(self._error).__name__
        exc = self._protocol.close_exc
        return str(exc) if exc is not None else "connection closed"
