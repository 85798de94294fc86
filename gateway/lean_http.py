"""A lean HTTP/1.1 front that answers simple requests itself and hands the rest to aiohttp.

Why: most of a small request's server CPU went into aiohttp's generic machinery
(request and response objects, header multidicts, routing, a task per message):
about 120 us per request on the benchmark machine against about 20 us for a bare
asyncio protocol. Users: the queue-only server (gateway/queue/server.py), the
gateway's listener (gateway/fast_front.py: plain queue and predict calls) and the
worker's direct-mode HTTP port (gateway/workers/main.py). Each passes ``serve``
(the handler, same checks as its aiohttp route) and hands everything else to
aiohttp, unchanged:

* simple = ``HTTP/1.1``, method GET/POST/PUT/DELETE, origin-form target under
  ``/api/predict/`` without ``%`` or ``#`` in the path, a ``Content-Length`` body
  (or none) within the size limit, no ``Transfer-Encoding``, ``Upgrade`` or
  ``Expect`` header, well-formed header lines;
* anything else (a WebSocket watch, a chunked body, HTTP/1.0, a malformed head)
  switches the connection to aiohttp's own protocol before a byte of that request
  is consumed, so aiohttp sees the connection exactly as the client sent it.

Requests on one connection are answered in order (pipelining is fine); each
answer is written with one ``write`` (TCP_NODELAY is set, so no Nagle delay).

In the gateway (gateway/fast_front.py) ``accept`` narrows the fast path to plain calls
on configured services, and the
optional timers give a fast-path connection the gateway's limits: a request head
must arrive within ``header_timeout`` (slowloris), an idle kept-alive connection is
closed after ``keepalive_timeout``, and a body still incomplete ``body_timeout`` after
its head is answered by ``late`` (a 408; without ``late`` the connection goes to
aiohttp, which then times the body on its own). ``early`` may refuse a request whose
head is in but whose body is not (a missing token: no body can fix it). Both answers
close the connection after a lingering close (see ``_Linger``).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import http
import logging
import re
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NamedTuple, cast

from eas_sdk._core.constants import PREDICT_PATH_PREFIX

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024
# aiohttp refuses (400) a request line or a header line longer than this: hand such heads over.
_MAX_LINE = 8190
_METHODS = frozenset(("GET", "POST", "PUT", "DELETE"))
_PREFIX = PREDICT_PATH_PREFIX
_REASONS = {s.value: s.phrase for s in http.HTTPStatus}
# A request with any of these goes to aiohttp (it implements them; we do not).
_HAND_OVER = ("transfer-encoding", "upgrade", "expect")
# After an answer given before the body was in: how long the rest is read and dropped
# before the connection closes (as the gateway's aiohttp ``lingering_time``).
LINGER_S = 2.0


class Reply(NamedTuple):
    """An answer, independent of the server that writes it (aiohttp or the fast path)."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] | None = None


_ERROR = Reply(500, b"500 Internal Server Error")  # a bug: answered like aiohttp, connection dropped
# Python 3.12+ starts a task eagerly by itself (and its wait_for needs a current task);
# on 3.11 FastProtocol._step drives the handler coroutine itself.
_EAGER_TASKS = sys.version_info >= (3, 12)


Query = list[tuple[str, str]]
Serve = Callable[["FastRequest", Query], Coroutine[Any, Any, Reply]]
# (method, path, headers, content length) of a simple request -> answer it here (else aiohttp does)
Accept = Callable[[str, str, "Headers", int], bool]
# An accepted request whose head is in, its body not (``body`` is empty) -> an answer that
# cannot wait for the body (early), or the answer to a body that missed body_timeout (late).
Early = Callable[["FastRequest"], "Reply | None"]
Late = Callable[["FastRequest"], "Reply"]
# What a connection's timer waits for (see FastProtocol._rearm).
_NO_TIMER, _IDLE, _HEAD, _BODY = 0, 1, 2, 3


class FastRequest:
    """The parts of a request that the queue handlers read (see ``http.RequestLike``)."""

    __slots__ = ("body", "content_length", "headers", "method", "path", "remote")

    def __init__(
        self,
        method: str,
        path: str,
        headers: Headers,
        content_length: int | None,
        body: bytes,
        remote: str | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.content_length = content_length
        self.body = body
        self.remote = remote

    async def read(self) -> bytes:
        return self.body


def parse_query(qs: str) -> Query:
    """Like yarl's ``URL.query`` (which aiohttp uses): ``&``-separated, ``+`` is a space."""
    if not qs:
        return []
    if "%" in qs or "+" in qs:
        return urllib.parse.parse_qsl(qs, keep_blank_values=True)
    out: Query = []
    for part in qs.split("&"):
        if part:
            k, _, v = part.partition("=")
            out.append((k, v))
    return out


_date_second = 0
_date_line = ""


def _date() -> str:
    """The ``Date`` header line (RFC 9110 asks servers with a clock to send one), built once a second."""
    global _date_second, _date_line
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        _date_line = f"Date: {email.utils.formatdate(now, usegmt=True)}\r\n"
    return _date_line


def encode_reply(reply: Reply, close: bool) -> bytes:
    status = reply.status
    parts = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
        f"Content-Type: {reply.content_type}\r\nContent-Length: {len(reply.body)}\r\n{_date()}"
    ]
    if reply.headers:
        for k, v in reply.headers.items():
            parts.append(f"{k}: {v}\r\n")
    if close:
        parts.append("Connection: close\r\n")
    parts.append("\r\n")
    return "".join(parts).encode("latin-1") + reply.body


# One header line: a token name, a colon, the value without surrounding blanks.
_HEADER = re.compile(r"([^:\r\n]+):([^\r\n]*)\r\n")  # on a block that passed _HEADER_BLOCK
_HEADER_BLOCK = re.compile(r"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\r\n]*\r\n)*")


class Headers(dict[str, str]):
    """Request headers keyed by lower-case name (case-insensitive reads, first value wins)."""

    __slots__ = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict.get(self, key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return dict.__getitem__(self, key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and dict.__contains__(self, key.lower())


def _parse_head(head: bytes, max_body: int) -> tuple[str, str, str, Headers, int, bool] | None:
    """(method, path, query string, headers, content length, close) of a simple request, else None."""
    text = head.decode("latin-1")
    if len(text) > _MAX_LINE and any(len(line) > _MAX_LINE for line in text.split("\r\n")):
        return None
    first, _, rest = text.partition("\r\n")
    request_line = first.split(" ")
    if len(request_line) != 3:
        return None
    method, target, version = request_line
    if version != "HTTP/1.1" or method not in _METHODS or not target.startswith(_PREFIX):
        return None
    path, _, qs = target.partition("?")
    if "%" in path or "#" in target or len(path) <= len(_PREFIX):
        return None
    headers = Headers()
    if rest:
        rest += "\r\n"
        if _HEADER_BLOCK.fullmatch(rest) is None:
            return None  # a line that is not "name: value": let aiohttp judge it
        pairs = _HEADER.findall(rest)
        headers.update({k.lower(): v.strip(" \t") for k, v in pairs})
        if len(headers) != len(pairs):  # a repeated name: the first value wins (like aiohttp's get)
            headers.clear()
            for k, v in pairs:
                name = k.lower()
                if dict.__contains__(headers, name):
                    if name == "content-length":
                        return None
                    continue
                dict.__setitem__(headers, name, v.strip(" \t"))
    for name in _HAND_OVER:
        if dict.__contains__(headers, name):
            return None
    clen = 0
    raw = dict.get(headers, "content-length")
    if raw is not None:
        if not raw.isdigit() or not raw.isascii():
            return None
        clen = int(raw)
        if clen > max_body:
            return None  # aiohttp answers 413 for it
    close = dict.get(headers, "connection", "").lower() == "close"
    return method, path, qs, headers, clen, close


class FastProtocol(asyncio.Protocol):
    def __init__(
        self,
        serve: Serve,
        fallback: Callable[[], asyncio.Protocol],
        conns: set[FastProtocol],
        max_body: int,
        *,
        accept: Accept | None = None,
        header_timeout: float = 0.0,
        keepalive_timeout: float = 0.0,
        body_timeout: float = 0.0,
        cancel_on_lost: bool = False,
        early: Early | None = None,
        late: Late | None = None,
    ) -> None:
        self._serve = serve
        self._fallback = fallback
        self._conns = conns
        self._max_body = max_body
        self._accept = accept
        self._early = early
        self._late = late
        # 0 = no limit (the queue-only server); the gateway passes its own limits.
        self._delays = {_IDLE: keepalive_timeout, _HEAD: header_timeout, _BODY: body_timeout}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_kind = _NO_TIMER
        self._remote: str | None = None
        self._active = 0.0  # loop time of the last answer (the keep-alive timer counts from it)
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self.busy = False
        self._closing = False
        self._task: asyncio.Task[Reply] | None = None
        # Python < 3.12: the handler coroutine driven by _step and the future it awaits.
        self._coro: Coroutine[Any, Any, Reply] | None = None
        self._waiting: Any = None
        # The client left: cancel its handler (like aiohttp's handler_cancellation=True).
        self._cancel_on_lost = cancel_on_lost
        self.idle: asyncio.Future[None] | None = None  # set by close_all: resolved after the answer

    # ------------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, (tuple, list)) and peer:
            self._remote = str(peer[0])
        self._conns.add(self)
        self._active = asyncio.get_running_loop().time()
        self._arm(_HEAD)  # the first request head is due within header_timeout too

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self._disarm()
        self._conns.discard(self)
        if self.busy and self._cancel_on_lost:
            if self._task is not None:
                self._task.cancel()
            elif self._coro is not None and self._waiting is not None:
                # Throw into the handler at its await; the future it awaited is left alone
                # (it may be shared, e.g. a batch commit) and its late callback is ignored.
                self._waiting = None
                self._step(self._coro, True, False, asyncio.CancelledError())

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if not self.busy:
            self._next()

    def eof_received(self) -> bool | None:
        return None  # close our side too (pending answers are dropped, like aiohttp does)

    # ------------------------------------------------------------------ requests
    def close_when_idle(self) -> None:
        """Shutdown: close now if idle, else after the answer in progress."""
        self._closing = True
        if not self.busy and self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------------ timers
    def _arm(self, kind: int) -> None:
        """Start the timer for ``kind`` unless it already runs: more bytes never extend it."""
        if self._timer_kind == kind:
            return
        self._disarm()
        delay = self._delays[kind]
        if delay > 0:
            self._timer = asyncio.get_running_loop().call_later(delay, self._expired)
            self._timer_kind = kind

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_kind = _NO_TIMER

    def _rearm(self) -> None:
        """After the buffer was worked through: time whatever the connection now waits for.
        While a handler works nothing is timed (a timer that fires then does nothing, and
        the next call here starts the right one afresh)."""
        if self.transport is None:
            self._disarm()
        elif self.busy:
            return
        elif not self._buf:
            self._arm(_IDLE)  # runs on across requests: _expired checks the last answer's time
        elif self._buf.find(b"\r\n\r\n") < 0:
            self._arm(_HEAD)
        else:
            self._arm(_BODY)

    def _expired(self) -> None:
        kind, self._timer, self._timer_kind = self._timer_kind, None, _NO_TIMER
        t = self.transport
        if t is None or self.busy:
            return
        if kind == _IDLE:
            left = self._active + self._delays[_IDLE] - asyncio.get_running_loop().time()
            if left > 0:  # answered something since it was armed: wait the rest
                self._timer = asyncio.get_running_loop().call_later(left, self._expired)
                self._timer_kind = _IDLE
                return
        elif kind == _BODY:
            late = self._late
            waiting = self._waiting_request() if late is not None else None
            if late is None or waiting is None:
                self._hand_over()  # aiohttp times the body out with its own timer
            else:
                # One body_timeout from the head, answered here: handing over would start
                # aiohttp's timer afresh and double the wait.
                self._refuse(late(waiting[0]), waiting[1])
            return
        else:
            delay = self._delays[kind]
            log.info("closing connection from %s: no request head within %.3g s", self._remote, delay)
        self.transport = None
        self._conns.discard(self)
        t.close()

    # ------------------------------------------------------------------ requests
    def _next(self) -> None:
        self._drain()
        self._rearm()

    def _drain(self) -> None:
        """Answer every complete request in the buffer, in order, until one has to wait."""
        buf = self._buf
        while buf and self.transport is not None and not self.busy:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD or not buf[:1].isalpha():
                    self._hand_over()
                return
            parsed = _parse_head(bytes(buf[:end]), self._max_body)
            if parsed is None:
                self._hand_over()
                return
            method, path, qs, headers, clen, close = parsed
            if self._accept is not None and not self._accept(method, path, headers, clen):
                self._hand_over()
                return
            total = end + 4 + clen
            if len(buf) < total:
                # The body is still arriving. The first time (its timer is not running yet),
                # ask whether the request can be refused without it.
                if self._early is not None and self._timer_kind != _BODY:
                    req = FastRequest(method, path, headers, clen, b"", self._remote)
                    reply = self._early(req)
                    if reply is not None:
                        self._refuse(reply, total - len(buf))
                return
            body = bytes(buf[end + 4 : total])
            del buf[:total]
            if self._timer_kind >= _HEAD:
                self._disarm()  # the request is complete: its head/body deadline is met
            req = FastRequest(
                method, path, headers, clen if "Content-Length" in headers else None, body, self._remote
            )
            self._start(self._serve(req, parse_query(qs)), close)

    def _start(self, coro: Coroutine[Any, Any, Reply], close: bool) -> None:
        """Run the handler at once, in this callback (no task hop)."""
        self.busy = True
        if _EAGER_TASKS:
            task: asyncio.Task[Reply] = asyncio.Task(coro, eager_start=True)  # type: ignore[call-arg]
            if task.done():
                self._finish(task, close)
            else:
                self._task = task  # keep it referenced while it waits
                task.add_done_callback(lambda t: self._finish(t, close, resume=True))
            return
        self._step(coro, close, False)

    def _step(
        self,
        coro: Coroutine[Any, Any, Reply],
        close: bool,
        resume: bool,
        throw: BaseException | None = None,
    ) -> None:
        """Python 3.11: drive the handler by hand. It awaits only futures (a commit, a long-poll
        wake-up, a timer); each resumes it straight from the future's done callback, so an answer
        is written one loop hop after the commit instead of three (task wake-up, task end,
        done callback), and no Task object is made per call."""
        self._coro = coro
        try:
            yielded = coro.send(None) if throw is None else coro.throw(throw)
        except StopIteration as stop:
            self._answer(stop.value, close)
        except asyncio.CancelledError:
            self._answer(_ERROR, True)  # the client left (connection_lost): nobody to answer
        except Exception:
            log.exception("request failed")
            self._answer(_ERROR, True)
        else:
            if yielded is None:  # a bare yield (sleep(0)): run again on the next iteration
                self._waiting = True
                asyncio.get_running_loop().call_soon(self._resume, coro, close, True)
            elif getattr(yielded, "_asyncio_future_blocking", None) is None:
                coro.close()  # not an asyncio future: nothing here awaits such a thing
                log.error("request handler awaited %r", type(yielded).__name__)
                self._answer(_ERROR, True)
            else:
                yielded._asyncio_future_blocking = False
                self._waiting = yielded
                yielded.add_done_callback(lambda f: self._resume(coro, close, f))
            return
        if resume and not self.busy:
            self._next()

    def _resume(self, coro: Coroutine[Any, Any, Reply], close: bool, waited: Any) -> None:
        if self._coro is coro and self._waiting is waited:  # else: cancelled meanwhile
            self._waiting = None
            self._step(coro, close, True)

    def _finish(self, task: asyncio.Task[Reply], close: bool, resume: bool = False) -> None:
        if task.cancelled():
            self._answer(_ERROR, True)
            return
        exc = task.exception()
        if exc is not None:
            log.error("request failed", exc_info=exc)
            self._answer(_ERROR, True)
            return
        self._answer(task.result(), close)
        if resume and not self.busy:
            self._next()

    def _answer(self, reply: Reply, close: bool) -> None:
        self.busy = False
        self._task = None
        self._coro = self._waiting = None
        if self.idle is not None and not self.idle.done():
            self.idle.set_result(None)
        t = self.transport
        if t is None:
            return
        if self._timer_kind == _IDLE:
            self._active = asyncio.get_running_loop().time()
        close = close or self._closing
        t.write(encode_reply(reply, close))
        if close:
            t.close()
            self.transport = None

    def _waiting_request(self) -> tuple[FastRequest, int] | None:
        """The buffered request whose body is still arriving (body empty), and how many body
        bytes are missing; None when the buffer holds no such request."""
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        parsed = _parse_head(bytes(buf[:end]), self._max_body) if end >= 0 else None
        if parsed is None:
            return None
        method, path, _, headers, clen, _ = parsed
        missing = end + 4 + clen - len(buf)
        if missing <= 0:
            return None
        return FastRequest(method, path, headers, clen, b"", self._remote), missing

    def _detach(self) -> tuple[asyncio.Transport | None, bytes]:
        """Stop serving this connection: -> its transport (None if already gone) and the
        bytes received but not consumed, for whatever protocol takes it over."""
        t = self.transport
        if t is None:
            return None, b""
        self.transport = None
        self._disarm()
        self._conns.discard(self)
        data, self._buf = bytes(self._buf), bytearray()
        return t, data

    def _refuse(self, reply: Reply, missing: int) -> None:
        """Answer the request whose body is still arriving, then close the connection once
        the ``missing`` body bytes are read and dropped (a lingering close, ``_Linger``)."""
        t, _unread = self._detach()
        if t is None:
            return
        t.write(encode_reply(reply, True))
        t.set_protocol(_Linger(t, missing, self._conns))

    def _hand_over(self) -> None:
        """Give the connection, with every unconsumed byte, to aiohttp's protocol."""
        t, data = self._detach()
        if t is None:
            return
        proto = self._fallback()
        t.set_protocol(proto)
        proto.connection_made(t)
        if data:
            proto.data_received(data)


class _Linger(asyncio.Protocol):
    """A connection answered before its body was in: read and drop what the client still
    sends until the body is complete, the client closes, or ``LINGER_S`` pass; then close.
    Closing a socket that holds unread data sends a TCP RST, and a client still uploading
    (urllib3 writes the whole body before it reads) would get a reset instead of the answer.
    It stays in the server's connection set, so shutdown (``close_all``) closes it too."""

    busy = False
    idle: asyncio.Future[None] | None = None

    def __init__(self, transport: asyncio.Transport, missing: int, conns: set[Any]) -> None:
        self.transport: asyncio.Transport | None = transport
        self._missing = missing
        self._conns = conns
        conns.add(self)
        self._timer = asyncio.get_running_loop().call_later(LINGER_S, self.close_when_idle)

    def data_received(self, data: bytes) -> None:
        self._missing -= len(data)
        if self._missing <= 0:
            self.close_when_idle()

    def eof_received(self) -> bool | None:
        self.close_when_idle()
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._timer.cancel()
        self._conns.discard(self)
        self.transport = None

    def close_when_idle(self) -> None:
        self._timer.cancel()
        self._conns.discard(self)
        t, self.transport = self.transport, None
        if t is not None:
            t.close()


async def close_all(conns: set[FastProtocol], timeout: float) -> None:
    """Let answers in progress finish (bounded), then close every fast-path connection."""
    loop = asyncio.get_running_loop()
    waits = []
    for c in list(conns):
        if c.busy:
            c.idle = loop.create_future()
            waits.append(c.idle)
        c.close_when_idle()
    if waits:
        await asyncio.wait(waits, timeout=timeout)
    for c in list(conns):
        if c.transport is not None:
            c.transport.close()
