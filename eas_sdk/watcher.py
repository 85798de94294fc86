"""Watcher / AsyncWatcher: records pushed by the queue server over a WebSocket.

Built on the ``websockets`` library: the asyncio watcher on its asyncio client, the
blocking one on its protocol with a reader thread of our own that hands messages over
in batches (``eas_sdk._transports.websocket``). Both ping every 2 s, notice a dead
connection within ``ping_interval + ping_timeout``, and reconnect a dropped one with
jittered back-off (at most 2 s) while the watcher is not closed. Records delivered but
not committed before a drop come back (the server's consumer group keeps them). A 4xx at
the handshake (bad token, bad window) is raised instead of retried for ever; a frame that
does not decode is a broken stream.

A watcher never sees its client: the client hands it a frozen ``WatchSettings`` and a
``WatchClaim`` through which it asks to hold the client's one watcher slot, so this
module imports no client module and the clients import it freely.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import ssl
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from types import TracebackType
from typing import Any, Protocol, TypeVar

from ._core.queue import DataFrame
from ._core.queue_call import status_error
from ._transports._shared import tls_context
from .errors import PredictException

RECONNECT_BASE = 0.1
RECONNECT_CAP = 2.0
WATCH_MAX_QUEUE = 4096
CLOSE_TIMEOUT = 1.0

_W_contra = TypeVar("_W_contra", contravariant=True)


@dataclasses.dataclass(frozen=True)
class WatchSettings:
    """What a watcher needs from its client, taken when the client builds the watcher.

    A value rather than the client itself, so the watcher depends on no client module
    and a setting changed on the client later does not change a watch already made.
    """

    open_timeout: float
    ping_interval: float | None
    ping_timeout: float | None
    ca_certs: str | None = None  # a PEM bundle trusted for wss:// instead of the system's CAs
    client_cert: str | tuple[str, str] | None = None  # presented for mTLS
    logger: logging.Logger | None = None


class WatchClaim(Protocol[_W_contra]):
    """The client's "one running watcher" rule: the client keeps the state, a watcher asks.

    ``claim`` is refused (False) while another watcher, or another run of the same one,
    holds the client; ``release`` by a watcher that no longer holds it does nothing, so a
    closed watcher's late clean-up never frees the claim of the one started after it.
    """

    def claim(self, watcher: _W_contra) -> bool: ...

    def release(self, watcher: _W_contra) -> None: ...


def _reconnect_delay(attempt: int, rng: random.Random) -> float:
    # Full jitter, capped at 2 s, so a fleet of watchers does not reconnect in lockstep.
    return rng.random() * min(RECONNECT_CAP, RECONNECT_BASE * (1 << min(attempt, 10)))


def _tls(settings: WatchSettings, url: str) -> ssl.SSLContext | None:
    """For wss://, the client's trust: its ``ca_certs`` bundle, else the system's CAs."""
    return tls_context(settings.ca_certs, settings.client_cert) if url.startswith("wss://") else None


def _connect_options(
    settings: WatchSettings, tls: ssl.SSLContext | None, headers: dict[str, str]
) -> dict[str, Any]:
    """The asyncio watcher's ``websockets`` connect() options (the sync watcher's connection
    takes the same ones it has)."""
    return {
        **({"ssl": tls} if tls is not None else {}),
        "additional_headers": headers,
        "compression": None,
        "max_size": None,
        # Frames are small and many: a deep receive queue keeps the socket drained
        # instead of pausing reads every 16 messages.
        "max_queue": WATCH_MAX_QUEUE,
        "proxy": None,
        "open_timeout": settings.open_timeout,
        "ping_interval": settings.ping_interval,
        "ping_timeout": settings.ping_timeout,
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


def _refused() -> PredictException:
    return PredictException(400, "Another watcher is already running")


class _WatcherState:
    """What the sync and asyncio watchers both keep: where to connect, the live socket, counters."""

    def __init__(self, url: str, headers: dict[str, str], settings: WatchSettings) -> None:
        self.url = url
        self.headers = headers
        self.settings = settings
        self.closed = False
        self.reconnects = 0
        self._ws: Any = None


class Watcher(_WatcherState):
    """Records pushed by the server over a WebSocket; iterate ``run()``, then ``close()``."""

    def __init__(
        self, url: str, headers: dict[str, str], *, settings: WatchSettings, claim: WatchClaim[Watcher]
    ) -> None:
        super().__init__(url, headers, settings)
        self._claim = claim
        self._lock = threading.Lock()

    def run(self) -> Generator[DataFrame, None, None]:
        from google.protobuf.message import DecodeError
        from websockets.exceptions import WebSocketException

        from ._transports.websocket import SyncWebSocket

        if not self._claim.claim(self):
            raise _refused()
        settings, logger = self.settings, self.settings.logger
        rng = random.Random()
        failures = 0
        try:
            tls = _tls(settings, self.url)
            while not self.closed:
                try:
                    ws = SyncWebSocket.connect(
                        self.url, self.headers,
                        open_timeout=settings.open_timeout,
                        ping_interval=settings.ping_interval, ping_timeout=settings.ping_timeout,
                        max_queue=WATCH_MAX_QUEUE, close_timeout=CLOSE_TIMEOUT, tls=tls,
                    )  # fmt: skip
                except (OSError, WebSocketException, TimeoutError) as exc:
                    final = _handshake_error(exc)
                    if final is not None:
                        raise final from None
                    delay = _reconnect_delay(failures, rng)
                    failures += 1
                    if logger:
                        logger.warning("watch connect failed (%s); retrying in %.2fs", exc, delay)
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
                    if logger:
                        logger.warning("watch connection lost (%s); reconnecting", exc)
                    time.sleep(_reconnect_delay(0, rng))
                finally:
                    with self._lock:
                        self._ws = None
                    ws.close()
        finally:
            self._claim.release(self)

    def __iter__(self) -> Iterator[DataFrame]:
        return self.run()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            ws = self._ws
        # A closed watcher is no longer running: a new one may start at once, as with the
        # reference client, even before this one's run() has wound down.
        self._claim.release(self)
        if ws is not None:
            with contextlib.suppress(Exception):  # already gone
                ws.close()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncWatcher(_WatcherState):
    """``async for df in client.watch(...)``; ``await watcher.close()`` to stop."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        *,
        settings: WatchSettings,
        claim: WatchClaim[AsyncWatcher],
    ) -> None:
        super().__init__(url, headers, settings)
        self._claim = claim

    async def run(self) -> AsyncGenerator[DataFrame, None]:
        from google.protobuf.message import DecodeError
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, WebSocketException

        if not self._claim.claim(self):
            raise _refused()
        settings, logger = self.settings, self.settings.logger
        rng = random.Random()
        failures = 0
        try:
            options = _connect_options(settings, _tls(settings, self.url), self.headers)
            while not self.closed:
                try:
                    ws = await connect(self.url, **options)
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
                    if logger:
                        logger.warning("watch connection lost (%s); reconnecting", exc)
                    await asyncio.sleep(_reconnect_delay(0, rng))
                finally:
                    self._ws = None
                    await ws.close()
        finally:
            self._claim.release(self)

    def __aiter__(self) -> AsyncIterator[DataFrame]:
        return self.run()

    async def close(self) -> None:
        self.closed = True
        self._claim.release(self)  # a new watcher may start now
        ws = self._ws
        if ws is not None:
            await ws.close()

    async def __aenter__(self) -> AsyncWatcher:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
