"""Framed RPC between the gateway and its worker processes over unix sockets.

Frame: a 13-byte header ``!IQB`` (payload length, request id, kind) and the payload.
Requests are pipelined: many are in flight on one connection and responses come
back in any order, matched by id. The client keeps a few persistent connections
per worker (measured: 0.89 of the throughput of calling the worker directly, against
0.28 for an HTTP proxy hop).

Kinds: REQUEST (client -> worker), RESPONSE, CANCEL (drop a request that has not
started yet), PING / PONG (health; the pong carries the worker's counters as JSON),
HELLO (the first frame on a TCP connection to a remote worker: the service's
worker token, without which the worker closes the connection; a local worker's unix
socket is private to the gateway's user, so it needs none).

Addresses: a unix socket path, or ``tcp://host:port`` for a remote worker.

Writes are corked: frames produced in one event-loop iteration leave in one
``write`` call, which keeps syscalls per request low under load.

Large bodies are copied as few times as the transport allows. A sender hands a frame with
a large part to ``writelines`` (not joined into one more copy first). A receiver gathers a
large request or response chunk by chunk as the transport delivers them (no growing buffer,
which would copy it several times over as it grows) and joins the chunks once, straight
into the body: one copy on each side beyond the kernel's, where a small frame takes two.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.core.calls import WorkerRequest, WorkerResponse

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is part of the gateway extra
    _orjson = None

HEADER = struct.Struct("!IQB")
HEADER_SIZE = HEADER.size
_META_LEN = struct.Struct("!I")
_RESP_HEAD = struct.Struct("!HQH")  # status, compute_us, content-type length

REQUEST, RESPONSE, CANCEL, PING, PONG, HELLO = 1, 2, 3, 4, 5, 6
TCP_PREFIX = "tcp://"
# A connection with this many corked parts (a few small frames) takes no more this iteration.
_COALESCE_PARTS = 64
# A frame larger than this is a protocol error (bodies are capped far below by the gateway).
MAX_FRAME = 1 << 30
# A part or a frame at least this large is written without a join, and gathered by chunks.
LARGE = 1 << 18
_HELLO_MAX = 4096


def _dumps(obj: Any) -> bytes:
    if _orjson is not None:
        return _orjson.dumps(obj)
    return json.dumps(obj, separators=(",", ":")).encode()


def _loads(data: bytes | memoryview) -> Any:
    if _orjson is not None:
        return _orjson.loads(data)
    return json.loads(bytes(data))


def encode_request(req: WorkerRequest) -> list[bytes]:
    meta = _dumps([req.subpath, req.content_type, req.request_id, req.headers, req.deadline])
    return [_META_LEN.pack(len(meta)), meta, req.body]


def decode_request(payload: bytes, body: bytes | None = None) -> WorkerRequest:
    """``payload``: the whole frame's, or only what comes before the body when ``body`` is
    given apart (a large frame, gathered straight into its body)."""
    (n,) = _META_LEN.unpack_from(payload)
    subpath, ctype, rid, headers, deadline = _loads(memoryview(payload)[4 : 4 + n])
    return WorkerRequest(payload[4 + n :] if body is None else body, subpath, ctype, rid, headers, deadline)


def encode_response(resp: WorkerResponse) -> list[bytes]:
    ct = resp.content_type.encode("latin-1", "replace")
    return [_RESP_HEAD.pack(resp.status, max(0, resp.compute_us), len(ct)), ct, resp.body]


def decode_response(payload: bytes, body: bytes | None = None) -> WorkerResponse:
    """``payload`` and ``body`` as for :func:`decode_request`."""
    status, compute_us, n = _RESP_HEAD.unpack_from(payload)
    start = _RESP_HEAD.size
    ctype = payload[start : start + n].decode("latin-1")
    return WorkerResponse(status, payload[start + n :] if body is None else body, ctype, compute_us)


def _body_start(kind: int, head: Any) -> int | None:
    """Where the body of a REQUEST or RESPONSE payload starts, when ``head`` (its first
    bytes) holds all that comes before it; else None."""
    if kind == REQUEST and len(head) >= _META_LEN.size:
        start = _META_LEN.size + _META_LEN.unpack_from(head)[0]
    elif kind == RESPONSE and len(head) >= _RESP_HEAD.size:
        start = _RESP_HEAD.size + _RESP_HEAD.unpack_from(head)[2]
    else:
        return None
    return start if start <= len(head) else None


@dataclass(slots=True)
class _Gathering:
    """A large frame arriving chunk by chunk."""

    rid: int
    kind: int
    length: int
    parts: list[Any]
    got: int


class WorkerConnectionError(ConnectionError):
    """The connection to a worker failed before its answer arrived (safe to retry elsewhere)."""


class IPCTimeout(TimeoutError):
    """No answer within the call's timeout; a cancel frame has been sent."""


class FramedProtocol(asyncio.Protocol):
    """Frame parsing and corked writes shared by both ends."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._gathering: _Gathering | None = None
        self._out: list[bytes] = []
        self._large_out = False
        self._flush_scheduled = False
        self.closed = False
        self.max_frame = MAX_FRAME

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._gathering is not None:
            rest = self._gather(data)
            if rest is None or self.closed:
                return
            data = rest
        buf = self._buf
        buf += data
        pos = 0
        n = len(buf)
        while n - pos >= HEADER_SIZE:
            length, rid, kind = HEADER.unpack_from(buf, pos)
            if length > self.max_frame:
                self.abort()
                return
            end = pos + HEADER_SIZE + length
            if end > n:
                if length >= LARGE and kind in (REQUEST, RESPONSE):
                    # The rest arrives chunk by chunk: keep the chunks, join them once.
                    part = bytes(memoryview(buf)[pos + HEADER_SIZE : n])
                    self._gathering = _Gathering(rid, kind, length, [part], n - pos - HEADER_SIZE)
                    pos = n
                break
            if length < LARGE:  # small: a bytearray slice is the cheaper call
                payload = bytes(buf[pos + HEADER_SIZE : end])
            else:  # one copy out of the buffer (slicing the bytearray first would make two)
                payload = bytes(memoryview(buf)[pos + HEADER_SIZE : end])
            pos = end
            self.frame_received(rid, kind, payload)
            if self.closed:
                return
        if pos:
            del buf[:pos]

    def _gather(self, data: bytes) -> bytes | None:
        """Add a chunk to the large frame being gathered; -> the bytes after the frame once
        it is complete (handed on, the body apart), else None."""
        g = self._gathering
        assert g is not None
        need = g.length - g.got
        rest: bytes | None = None
        if len(data) > need:
            view = memoryview(data)
            data, rest = view[:need], bytes(view[need:])
        g.parts.append(data)
        g.got += len(data)
        if g.got < g.length:
            return None
        self._gathering = None
        first = g.parts[0]
        start = _body_start(g.kind, first)
        if start is None:  # what comes before the body spans chunks: join the whole
            self.frame_received(g.rid, g.kind, b"".join(g.parts))
        else:
            body = b"".join([memoryview(first)[start:], *g.parts[1:]])
            self.frame_received(g.rid, g.kind, first[:start], body)
        return rest if rest is not None else b""

    def frame_received(self, rid: int, kind: int, payload: bytes, body: bytes | None = None) -> None:
        """A whole frame's ``payload``; a large REQUEST or RESPONSE may come as what precedes
        its body, and the ``body`` apart."""
        raise NotImplementedError

    def send(self, rid: int, kind: int, parts: list[bytes]) -> None:
        if self.closed or self.transport is None:
            return
        self._out.append(HEADER.pack(sum(len(p) for p in parts), rid, kind))
        self._out.extend(parts)
        if parts and len(parts[-1]) >= LARGE:  # a frame's body is its last part
            self._large_out = True
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        large, self._large_out = self._large_out, False
        if out and not self.closed and self.transport is not None:
            if large:  # the transport takes the parts as they are: no copy to join them
                self.transport.writelines(out)
            else:
                self.transport.write(b"".join(out))

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()


class _ClientProtocol(FramedProtocol):
    def __init__(self, on_lost: Callable[[], None] | None) -> None:
        super().__init__()
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self._on_lost = on_lost

    def frame_received(self, rid: int, kind: int, payload: bytes, body: bytes | None = None) -> None:
        fut = self.pending.pop(rid, None)
        if fut is None or fut.done():
            return  # answered after a timeout/cancel: drop
        if kind == RESPONSE:
            fut.set_result(decode_response(payload, body))
        elif kind == PONG:
            fut.set_result(_loads(payload) if payload else {})

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(WorkerConnectionError("connection to the worker was lost"))
        if self._on_lost is not None:
            self._on_lost()


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(IPCTimeout())


class IPCClient:
    """Pipelined client over ``connections`` persistent unix-socket connections to one worker."""

    def __init__(
        self,
        path: str,
        connections: int = 2,
        on_lost: Callable[[], None] | None = None,
        key: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.path = path
        self._key = key
        self._tls = tls  # a remote worker's TCP connection over (mutual) TLS
        self.connections = max(1, connections)
        self._conns: list[_ClientProtocol] = []
        self._ids = itertools.count(1)
        self._on_lost = on_lost
        self._lost_reported = False

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self.connections):
            if self.path.startswith(TCP_PREFIX):
                host, port = split_tcp(self.path)
                _, proto = await loop.create_connection(
                    lambda: _ClientProtocol(self._lost),
                    host,
                    port,
                    ssl=self._tls,
                    server_hostname=host if self._tls is not None else None,
                )
            else:
                _, proto = await loop.create_unix_connection(lambda: _ClientProtocol(self._lost), self.path)
            if self._key is not None:
                proto.send(0, HELLO, [self._key.encode()])
            self._conns.append(proto)

    def _lost(self) -> None:
        # One lost connection means the worker is going away: report once.
        if not self._lost_reported:
            self._lost_reported = True
            if self._on_lost is not None:
                self._on_lost()

    @property
    def alive(self) -> bool:
        return bool(self._conns) and not any(c.closed for c in self._conns)

    def _pick(self) -> _ClientProtocol:
        best: _ClientProtocol | None = None
        for c in self._conns:
            if c.closed:
                continue
            if c._flush_scheduled and len(c._out) < _COALESCE_PARTS:
                # Frames already corked for this loop iteration: join them, so the
                # iteration costs one write here and one wake-up in the worker.
                return c
            if best is None or len(c.pending) < len(best.pending):
                best = c
        if best is None:
            raise WorkerConnectionError("no open connection to the worker")
        return best

    async def _call(self, kind: int, parts: list[bytes], timeout: float) -> Any:
        conn = self._pick()
        rid = next(self._ids)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        conn.pending[rid] = fut
        conn.send(rid, kind, parts)
        timer = loop.call_later(timeout, _expire, fut)
        try:
            return await fut
        except (asyncio.CancelledError, IPCTimeout):
            # Caller gave up (timeout or cancellation): tell the worker so a request that
            # has not started is dropped before the model runs.
            if conn.pending.pop(rid, None) is not None and kind == REQUEST:
                conn.send(rid, CANCEL, [])
            raise
        finally:
            timer.cancel()

    async def call(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        """Send ``req``; raises WorkerConnectionError, IPCTimeout (after sending a cancel)."""
        resp: WorkerResponse = await self._call(REQUEST, encode_request(req), timeout)
        return resp

    async def ping(self, timeout: float) -> dict[str, Any]:
        stats: dict[str, Any] = await self._call(PING, [], timeout)
        return stats

    def close(self) -> None:
        for c in self._conns:
            if c.transport is not None and not c.closed:
                c.transport.close()

    async def retire(self) -> None:
        """Close once the calls in flight are answered (or time out), reporting no loss:
        newer connections to the same worker carry its calls now."""
        self._on_lost = None
        pending = [f for c in self._conns for f in c.pending.values()]
        if pending:
            await asyncio.wait(pending)
        self.close()


# --- server side (inside the worker) ---------------------------------------------------


class RequestSink:
    """What the worker's IPC server hands requests to (see gateway.worker.main)."""

    def submit(self, req: WorkerRequest, done: Callable[[WorkerResponse | None], None]) -> Any:
        raise NotImplementedError

    def cancel(self, job: Any) -> None:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        raise NotImplementedError


def split_tcp(address: str) -> tuple[str, int]:
    """``tcp://host:port`` -> (host, port); ValueError when it is not one."""
    rest = address.removeprefix(TCP_PREFIX)
    host, sep, port = rest.rpartition(":")
    if not address.startswith(TCP_PREFIX) or not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r}: expected tcp://host:port")
    return host.strip("[]"), int(port)


def _too_large(size: int, limit: int, compute_us: int) -> WorkerResponse:
    # The size, the limit and the setting: the caller can tell what to change.
    message = (
        f"the answer would be {size} bytes ({size / 2**20:.1f} MiB), over the limit of {limit} bytes "
        f"({limit / 2**20:.1f} MiB) set by gateway.max_response_bytes"
    )
    body = _dumps({"code": "ResponseTooLarge", "message": message})
    return WorkerResponse(413, bytes(body), "application/json", compute_us)


class IPCServerProtocol(FramedProtocol):
    """The worker's end. With ``key`` (a remote worker on TCP), the first frame must be a
    HELLO carrying it, or the connection is closed before anything else is read."""

    def __init__(self, sink: RequestSink, max_response_bytes: int = 0, key: str | None = None) -> None:
        super().__init__()
        self.sink = sink
        self.jobs: dict[int, Any] = {}
        # An answer larger than this (gateway.max_response_bytes) is replaced by a 413 here,
        # so it never crosses to the gateway (0: no limit).
        self.max_response_bytes = max_response_bytes
        self._key = key.encode() if key is not None else None
        self._greeted = key is None
        if not self._greeted:
            self.max_frame = _HELLO_MAX  # nothing large is read from a peer not yet known

    def frame_received(self, rid: int, kind: int, payload: bytes, body: bytes | None = None) -> None:
        if not self._greeted:
            assert self._key is not None
            if kind != HELLO or not hmac.compare_digest(payload, self._key):
                self.abort()
                self.closed = True
                return
            self._greeted = True
            self.max_frame = MAX_FRAME
            return
        if kind == REQUEST:
            try:
                req = decode_request(payload, body)
            except Exception:
                self.send(rid, RESPONSE, encode_response(WorkerResponse(400, b"malformed IPC request")))
                return

            def done(resp: WorkerResponse | None, rid: int = rid) -> None:
                self.jobs.pop(rid, None)
                if resp is not None:
                    limit = self.max_response_bytes
                    if limit and len(resp.body) > limit:
                        resp = _too_large(len(resp.body), limit, resp.compute_us)
                    self.send(rid, RESPONSE, encode_response(resp))

            job = self.sink.submit(req, done)
            if job is not None:  # None: answered already (the worker ran it inline)
                self.jobs[rid] = job
        elif kind == CANCEL:
            job = self.jobs.pop(rid, None)
            if job is not None:
                self.sink.cancel(job)
        elif kind == PING:
            self.send(rid, PONG, [_dumps(self.sink.stats())])

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        # The gateway is gone from this connection: nobody waits for these answers.
        jobs, self.jobs = self.jobs, {}
        for job in jobs.values():
            self.sink.cancel(job)
