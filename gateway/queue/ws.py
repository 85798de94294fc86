"""The WebSocket watch: one binary DataFrameProto per message, never a text frame.

Two tasks per connection: the reader keeps receiving (aiohttp answers pings and
runs the heartbeat only while someone reads) and notices the end of the
connection in every form: close frame, bare TCP close (EOF), reset, missed
heartbeat pongs. The writer hands records out as the consumer's window allows.
When the reader ends, the consumer disconnects and its outstanding records go
back to its group (after ``grace_s``, if configured; a reconnect of the same uid
in between takes them back). With ``watcher_idle_s`` a third task closes (1008) a
watcher that holds records and has neither read nor committed any for that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from aiohttp import WSCloseCode, WSMsgType, web

from eas_sdk._core import constants as C
from eas_sdk._proto.queue_pb2 import DataFrameProto
from gateway.config import QueueConfig
from gateway.queue.backend import StorageError
from gateway.queue.interfaces import QueueHost
from gateway.queue.params import bad, identity, parse_bool, parse_uint, query_dict, split_tags
from gateway.queue.records import Consumer, QueueError, Record
from gateway.queue.replies import error_response
from gateway.queue.store import Queue

log = logging.getLogger(__name__)

# Clients only send control frames; anything bigger than this is hostile.
CLIENT_MAX_MSG = 64 * 1024
MAX_WINDOW_HARD = 1 << 20
CLOSE_TIMEOUT_S = 2.0


def encode(rec: Record, data: bytes | None) -> bytes:
    """One delivery; ``data`` None for an index-only watch."""
    df = DataFrameProto()
    df.index = rec.idx
    df.tags.update(rec.tags)
    if data is not None:
        df.data = data
    return df.SerializeToString()


def binary_frame(payload: bytes) -> bytes:
    """One unmasked, unfragmented, uncompressed binary WebSocket frame (server to client)."""
    n = len(payload)
    if n < 126:
        head = bytes((0x82, n))
    elif n < 65536:
        head = bytes((0x82, 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x82, 127)) + n.to_bytes(8, "big")
    return head + payload


# Coalesced writes: frames of one hand-out go to the socket in one write; above this many
# buffered bytes the writer waits for the peer to read (it never buffers without bound).
WRITE_HIGH_WATER = 256 * 1024
DRAIN_RETRY_S = 0.05


class WatchParams(NamedTuple):
    index: int
    window: int
    auto_commit: bool
    index_only: bool
    tags: dict[str, str]


def watch_params(cfg: QueueConfig, request: web.Request) -> WatchParams:
    """A watch's query, checked; raises QueueError naming the parameter (also used by a
    gateway that forwards the watch, so that its refusals name the parameter too)."""
    query = query_dict(request.rel_url.query)
    index = parse_uint(query.get(C.Q_INDEX, "0"), C.Q_INDEX)
    auto_commit = parse_bool(query.get(C.Q_AUTO_COMMIT), C.Q_AUTO_COMMIT, False)
    index_only = parse_bool(query.get(C.Q_INDEX_ONLY), C.Q_INDEX_ONLY, False)
    raw_window = query.get(C.Q_WINDOW)
    if raw_window is None:
        raise bad(C.Q_WINDOW, "missing")
    window = parse_uint(raw_window, C.Q_WINDOW, lo=0, hi=MAX_WINDOW_HARD)
    if window > cfg.max_window:
        raise bad(C.Q_WINDOW, f"must be at most {cfg.max_window} (max_window), got {window}")
    if window == 0 and not auto_commit:
        raise bad(C.Q_WINDOW, "0 is only valid with _auto_commit_=true")
    return WatchParams(index, window, auto_commit, index_only, split_tags(query, _WATCH_KEYS))


async def handle_watch(mgr: QueueHost, q: Queue, request: web.Request) -> web.StreamResponse:
    try:
        index, window, auto_commit, index_only, tags = watch_params(q.cfg, request)
        uid, gid = identity(request)
        ws = web.WebSocketResponse(
            timeout=CLOSE_TIMEOUT_S,  # how long a close waits for the peer's close frame
            heartbeat=q.cfg.heartbeat_s or None,
            max_msg_size=CLIENT_MAX_MSG,
            compress=False,
            autoping=True,
        )
        if not ws.can_prepare(request).ok:
            raise bad(C.Q_WATCH, "a watch needs a WebSocket upgrade")
        consumer, dur = q.connect(gid, uid, index, window, auto_commit, tags)
    except QueueError as err:
        return error_response(err)
    try:
        if dur is not None:
            await dur  # a new group or filter is journalled first
        await ws.prepare(request)
    except StorageError as exc:
        # Refused: the store undid the watch before this resumed (Queue.connect).
        return error_response(QueueError(507, f"queue storage unavailable: {exc}"))
    except BaseException:
        # The client left while the group was journalled (the write goes on) or before the
        # upgrade was answered: the consumer never served, it leaves as any watcher does.
        q.disconnect(consumer)
        mgr.schedule_release(q, consumer)
        raise
    await _serve(mgr, q, ws, consumer, index_only, request.transport, request.writer.drain)
    return ws


_WATCH_KEYS = frozenset((C.Q_WATCH, C.Q_INDEX, C.Q_WINDOW, C.Q_INDEX_ONLY, C.Q_AUTO_COMMIT))


async def _serve(
    mgr: QueueHost,
    q: Queue,
    ws: web.WebSocketResponse,
    c: Consumer,
    index_only: bool,
    transport: asyncio.BaseTransport | None,
    drain: Callable[[], Awaitable[None]],
) -> None:
    wake = asyncio.Event()
    c.wake = wake.set
    mgr.watchers.add(ws)
    state = _WatchState()
    writer = asyncio.ensure_future(_writer(q, ws, c, wake, index_only, transport, drain, state))
    idle_s = q.cfg.watcher_idle_s
    watchdog = asyncio.ensure_future(_idle_watch(ws, c, idle_s, state, transport)) if idle_s > 0 else None
    try:
        async for msg in ws:
            c.last_seen = asyncio.get_running_loop().time()
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                # The protocol has no client data frames; refuse rather than guess.
                await ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"no data frames expected")
                break
            if msg.type == WSMsgType.ERROR:
                break
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.cancel()
        with contextlib.suppress(BaseException):
            await writer
        if watchdog is not None:
            if not state.closing:
                watchdog.cancel()
            with contextlib.suppress(BaseException):
                await watchdog  # an idle close under way ends by itself, bounded
        mgr.watchers.discard(ws)
        q.disconnect(c)
        mgr.schedule_release(q, c)
        if not ws.closed:
            with contextlib.suppress(Exception):
                await ws.close()


IDLE_CLOSE = WSCloseCode.POLICY_VIOLATION  # 1008


@dataclass
class _WatchState:
    writing: bool = False  # the writer holds frames the peer has not read yet
    closing: bool = False  # the idle watch is closing the connection


async def _idle_watch(
    ws: web.WebSocketResponse,
    c: Consumer,
    idle_s: float,
    state: _WatchState,
    transport: asyncio.BaseTransport | None,
) -> None:
    """Close a watcher that holds records (delivered, or waiting for it to read them) and
    has neither read nor committed any for ``idle_s``. A watcher waiting on an empty queue
    holds nothing and is never idle. Its records go back to its group when the reader ends."""
    while True:
        held = bool(c.pending) or state.writing
        quiet = time.monotonic() - c.progress
        if not held or quiet < idle_s:
            await asyncio.sleep(max(0.05, min(idle_s / 4, idle_s - quiet if held else idle_s)))
            continue
        log.info("watch %s.%s closed: idle %.0f s holding %d record(s)", c.gid, c.uid, quiet, len(c.pending))
        reason = f"idle: no record read or committed for {idle_s:g} s".encode()
        state.closing = True
        try:
            # A peer that does not read may never take the close frame: then drop the connection.
            await asyncio.wait_for(ws.close(code=IDLE_CLOSE, message=reason), CLOSE_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            if transport is not None:
                transport.abort()  # type: ignore[attr-defined]
        return


async def _write(direct: Any, frames: list[bytes], drain: Callable[[], Awaitable[None]]) -> None:
    """Write whole frames in one call, then wait while the peer has not read them."""
    if direct.is_closing():
        raise ConnectionResetError("watch connection closed")
    direct.write(b"".join(frames))
    while direct.get_write_buffer_size() > WRITE_HIGH_WATER:
        if direct.is_closing():
            raise ConnectionResetError("watch connection closed")
        await drain()  # returns when the transport resumes writing
        if direct.get_write_buffer_size() > WRITE_HIGH_WATER:
            await asyncio.sleep(DRAIN_RETRY_S)  # not paused after all: look again later


async def _flush(
    direct: Any, frames: list[bytes], drain: Callable[[], Awaitable[None]], c: Consumer, state: _WatchState
) -> None:
    """``_write``, marking the time it waits for the peer to read (the idle watch looks)."""
    state.writing = True
    await _write(direct, frames, drain)
    state.writing = False
    c.progress = time.monotonic()


def _take(q: Queue, c: Consumer) -> list[tuple[Record, int]]:
    held = bool(c.pending)
    items, _ = q.take(c)
    if items and not held:
        c.progress = time.monotonic()  # the idle clock starts when the watcher begins to hold records
    return items


async def _writer(
    q: Queue,
    ws: web.WebSocketResponse,
    c: Consumer,
    wake: asyncio.Event,
    index_only: bool,
    transport: asyncio.BaseTransport | None,
    drain: Callable[[], Awaitable[None]],
    state: _WatchState,
) -> None:
    # Frames are written straight to the connection's transport, all frames of one hand-out
    # in a single write (one syscall instead of one per record). Safe next to aiohttp's own
    # control frames: every write is a whole frame and the loop is single-threaded.
    # (uvloop's transports do not subclass asyncio.WriteTransport: check by behaviour.)
    direct: Any = (
        transport if hasattr(transport, "get_write_buffer_size") and hasattr(transport, "write") else None
    )
    if direct is not None:
        # The transport pauses the connection's protocol above this mark and resumes it once
        # the peer has read most of it: ``drain`` waits for that, no polling.
        direct.set_write_buffer_limits(high=WRITE_HIGH_WATER)
    try:
        while not ws.closed:
            items = _take(q, c)
            if not items:
                wake.clear()
                items = _take(q, c)
                if not items:
                    await wake.wait()
                    continue
            if direct is None:
                for rec, _count in items:
                    data = None if index_only else q.payload(rec)
                    if index_only or data is not None:
                        await ws.send_bytes(encode(rec, data))
                        c.progress = time.monotonic()
                continue
            # Frames are made and written WRITE_HIGH_WATER at a time, each write waiting for
            # room: a window of large records is never copied into the socket's buffer at once,
            # nor read back from disk (a payload that left memory is read as its frame is made).
            chunk: list[bytes] = []
            size = 0
            for rec, _count in items:
                data = None if index_only else q.payload(rec)
                if data is None and not index_only:
                    continue  # removed while earlier frames were written
                frame = binary_frame(encode(rec, data))
                chunk.append(frame)
                size += len(frame)
                if size >= WRITE_HIGH_WATER:
                    await _flush(direct, chunk, drain, c, state)
                    chunk, size = [], 0
            if chunk:
                await _flush(direct, chunk, drain, c, state)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a send failed: the connection is gone; the reader ends too
        log.debug("watch writer for %s.%s stopped: %s", c.gid, c.uid, exc)
        with contextlib.suppress(Exception):
            await ws.close(code=WSCloseCode.GOING_AWAY)
