"""Watcher / AsyncWatcher: records pushed by the queue server over a WebSocket.

Built on the ``websockets`` library: the asyncio watcher on its asyncio client, the
blocking one on its protocol with a reader thread of our own that hands messages over
in batches (``eas_sdk._transports.websocket``). Both ping every 2 s, notice a dead
connection within ``ping_interval + ping_timeout``, and reconnect a dropped one with
jittered back-off (at most 2 s) while the watcher is not closed. Records delivered but
not committed before a drop come back (the server's consumer group keeps them). A 4xx at
the handshake (bad token, bad window) is raised instead of retried for ever; a frame that
does not decode is a broken stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._core.queue import DataFrame
from ._core.queue_call import status_error
from ._transports._shared import tls_context
from .errors import PredictException

if TYPE_CHECKING:
    from .aio_queue import AsyncQueueClient
    from .queue import QueueClient

RECONNECT_BASE = 0.1
RECONNECT_CAP = 2.0
WATCH_MAX_QUEUE = 4096
CLOSE_TIMEOUT = 1.0

_C = TypeVar("_C")


def _reconnect_delay(attempt: int, rng: random.Random) -> float:
    # Full jitter, capped at 2 s, so a fleet of watchers does not reconnect in lockstep.
    return rng.random() * min(RECONNECT_CAP, RECONNECT_BASE * (1 << min(attempt, 10)))


def _open_timeout(client: Any) -> float:
    return max(1.0, client.timeout_ms / 1000.0)


def _tls(client: Any, url: str) -> ssl.SSLContext | None:
    """For wss://, the client's trust: its ``ca_certs`` bundle, else the system's CAs."""
    return tls_context(client.ca_certs) if url.startswith("wss://") else None


def _connect_options(client: Any, url: str, headers: Any) -> dict[str, Any]:
    """The asyncio watcher's ``websockets`` connect() options (the sync watcher's connection
    takes the same ones it has)."""
    tls = _tls(client, url)
    return {
        **({"ssl": tls} if tls is not None else {}),
        "additional_headers": headers,
        "compression": None,
        "max_size": None,
        # Frames are small and many: a deep receive queue keeps the socket drained
        # instead of pausing reads every 16 messages.
        "max_queue": WATCH_MAX_QUEUE,
        "proxy": None,
        "open_timeout": _open_timeout(client),
        "ping_interval": client.ping_interval,
        "ping_timeout": client.ping_timeout,
        "close_timeout": CLOSE_TIMEOUT,
    }


def _handshake_error(exc: BaseException) -> PredictException | None:
    """A 4xx answer to the upgrade is final (raised); anything else is worth a reconnect."""
    from websockets.exceptions import InvalidStatus

    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if 400 <= status < 500 and status not in (408, 429):
            body = exc.response.body or b""
            return status_error(status, body, dict(exc.response.headers.raw_items()))
    return None


class _WatcherState(Generic[_C]):
    """What the sync and asyncio watchers both keep: where to connect, the live socket, counters."""

    def __init__(self, client: _C, url: str, headers: dict[str, str]) -> None:
        self.client = client
        self.url = url
        self.headers = headers
        self.closed = False
        self.reconnects = 0
        self._ws: Any = None


class Watcher(_WatcherState["QueueClient"]):
    """Records pushed by the server over a WebSocket; iterate ``run()``, then ``close()``."""

    def __init__(self, client: QueueClient, url: str, headers: dict[str, str]) -> None:
        super().__init__(client, url, headers)
        self._lock = threading.Lock()

    def run(self) -> Iterator[DataFrame]:
        from google.protobuf.message import DecodeError
        from websockets.exceptions import WebSocketException

        from ._transports.websocket import SyncWebSocket

        with self.client.watch_lock:
            if self.client._watcher is not None and self.client._watcher is not self:
                raise PredictException(400, "Another watcher is already running")
            if self.client._watcher is self and self._ws is not None:
                raise PredictException(400, "Another watcher is already running")
            self.client._watcher = self
        rng = random.Random()
        failures = 0
        try:
            while not self.closed:
                try:
                    client = self.client
                    ws = SyncWebSocket.connect(
                        self.url, self.headers,
                        open_timeout=_open_timeout(client),
                        ping_interval=client.ping_interval, ping_timeout=client.ping_timeout,
                        max_queue=WATCH_MAX_QUEUE, close_timeout=CLOSE_TIMEOUT, tls=_tls(client, self.url),
                    )  # fmt: skip
                except (OSError, WebSocketException, TimeoutError) as exc:
                    final = _handshake_error(exc)
                    if final is not None:
                        raise final from None
                    delay = _reconnect_delay(failures, rng)
                    failures += 1
                    if self.client.logger:
                        self.client.logger.warning("watch connect failed (%s); retrying in %.2fs", exc, delay)
                    time.sleep(delay)
                    continue
                with self._lock:
                    if self.closed:
                        ws.close()
                        return
                    self._ws = ws
                failures = 0
                try:
                    while True:
                        msg = ws.recv()
                        if isinstance(msg, str):
                            raise ValueError("text frame on a queue watch")
                        yield DataFrame.decode(msg)
                except (OSError, ValueError, DecodeError) as exc:
                    # A frame that is not a DataFrameProto is a broken stream like any other.
                    if self.closed:
                        return
                    self.reconnects += 1
                    if self.client.logger:
                        self.client.logger.warning("watch connection lost (%s); reconnecting", exc)
                    time.sleep(_reconnect_delay(0, rng))
                finally:
                    with self._lock:
                        self._ws = None
                    ws.close()
        finally:
            with self.client.watch_lock:
                if self.client._watcher is self:
                    self.client._watcher = None

    def __iter__(self) -> Iterator[DataFrame]:
        return self.run()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):  # already gone
                ws.close()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncWatcher(_WatcherState["AsyncQueueClient"]):
    """``async for df in client.watch(...)``; ``await watcher.close()`` to stop."""

    def __init__(self, client: AsyncQueueClient, url: str, headers: dict[str, str]) -> None:
        super().__init__(client, url, headers)
        self._running = False

    async def run(self) -> AsyncIterator[DataFrame]:
        from google.protobuf.message import DecodeError
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, WebSocketException

        client = self.client
        # One running watcher per client, as QueueClient (no await in between: atomic).
        if (client._watcher is not None and client._watcher is not self) or self._running:
            raise PredictException(400, "Another watcher is already running")
        client._watcher = self
        self._running = True
        rng = random.Random()
        failures = 0
        try:
            while not self.closed:
                try:
                    ws = await connect(self.url, **_connect_options(client, self.url, self.headers))
                except (OSError, WebSocketException, asyncio.TimeoutError) as exc:
                    final = _handshake_error(exc)
                    if final is not None:
                        raise final from None
                    delay = _reconnect_delay(failures, rng)
                    failures += 1
                    await asyncio.sleep(delay)
                    continue
                if self.closed:
                    await ws.close()
                    return
                self._ws = ws
                failures = 0
                try:
                    while True:
                        msg = await ws.recv()
                        if isinstance(msg, str):
                            raise ValueError("text frame on a queue watch")
                        yield DataFrame.decode(msg)
                except (ConnectionClosed, OSError, ValueError, DecodeError, asyncio.TimeoutError) as exc:
                    # A frame that is not a DataFrameProto is a broken stream like any other.
                    if self.closed:
                        return
                    self.reconnects += 1
                    if client.logger:
                        client.logger.warning("watch connection lost (%s); reconnecting", exc)
                    await asyncio.sleep(_reconnect_delay(0, rng))
                finally:
                    self._ws = None
                    await ws.close()
        finally:
            self._running = False
            if client._watcher is self:
                client._watcher = None

    def __aiter__(self) -> AsyncIterator[DataFrame]:
        return self.run()

    async def close(self) -> None:
        self.closed = True
        if self.client._watcher is self:
            self.client._watcher = None  # a new watcher may start now
        ws = self._ws
        if ws is not None:
            await ws.close()

    async def __aenter__(self) -> AsyncWatcher:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
