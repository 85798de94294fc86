"""The asyncio side of the lean front: move bytes, run handlers, keep time.

:class:`~gateway.lean_http.connection.Connection` decides what the bytes mean; this
protocol feeds it, answers the requests it yields (in order, each with one ``write``;
TCP_NODELAY is set, so no Nagle delay), runs the connection's deadlines and hands the
connection to aiohttp's protocol when told to, replaying the bytes already received.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import socket
import sys
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple, Protocol, cast

from gateway.lean_http.connection import BODY, HAND_OVER, HEAD, IDLE, Connection, Ready
from gateway.lean_http.cork import MAX_KEPT, Cork
from gateway.lean_http.spin import BusyPoll
from gateway.lean_http.wire import Accept, Admit, Early, FastRequest, Late, Query, Reply, Serve, encode_reply

log = logging.getLogger("gateway.lean_http")

# After an answer given before the body was in: how long the rest is read and dropped
# before the connection closes (as the gateway's aiohttp ``lingering_time``).
LINGER_S = 2.0
# Stop reading from a client that pipelines this much while a handler works (flow control).
HIGH_WATER = 256 * 1024
_ERROR = Reply(500, b"500 Internal Server Error")  # a bug: answered like aiohttp, connection dropped
# Python 3.12+ starts a task eagerly by itself (and its wait_for needs a current task);
# on 3.11 FastProtocol._step drives the handler coroutine itself (see there why).
_EAGER_TASKS = sys.version_info >= (3, 12)
_NO_TIMER = -1


class Handler(Protocol):
    """What answers the fast path: ``serve`` is required, the other hooks are optional."""

    async def serve(self, req: FastRequest, query: Query) -> Reply: ...


class Hooks(NamedTuple):
    serve: Serve
    accept: Accept | None = None  # None: every simple request is answered here
    early: Early | None = None
    late: Late | None = None  # None: a late body goes to aiohttp, which times it on its own
    admit: Admit | None = None  # None: bodies are received without asking

    @classmethod
    def of(cls, handler: Handler) -> Hooks:
        hook = getattr
        return cls(
            handler.serve,
            hook(handler, "accept", None),
            hook(handler, "early", None),
            hook(handler, "late", None),
            hook(handler, "admit", None),
        )


class Limits(NamedTuple):
    """A connection's limits; a timeout of 0 means none (the queue-only server)."""

    max_body: int
    header_timeout: float = 0.0  # a request head must arrive within this (slowloris)
    keepalive_timeout: float = 0.0  # an idle kept-alive connection is closed after this
    body_timeout: float = 0.0  # a body still incomplete this long after its head: ``late``
    cancel_on_lost: bool = False  # the client left: cancel its handler
    busy_poll_s: float = 0.0  # after an answer, poll for the next request this long (see .spin)

    @classmethod
    def of(cls, gateway: Any, max_body: int, *, cancel_on_lost: bool = False) -> Limits:
        """The limits in a ``GatewayConfig`` (``*_timeout_s``, ``busy_poll_us``)."""
        g = gateway
        return cls(
            max_body,
            g.header_timeout_s,
            g.keepalive_timeout_s,
            g.body_timeout_s,
            cancel_on_lost,
            g.busy_poll_us / 1e6,
        )


def protocol_factory(
    handler: Handler | Hooks, fallback: Callable[[], asyncio.Protocol], conns: set[Any], limits: Limits
) -> Callable[[], FastProtocol]:
    """For ``loop.create_server``: connections on the fast path, handed to ``fallback()``
    (aiohttp's ``web.Server``) for whatever ``handler`` does not answer. ``conns`` tracks
    the open fast-path connections, for :func:`close_all`."""
    hooks = handler if isinstance(handler, Hooks) else Hooks.of(handler)
    cork = Cork()  # the listener's answers are written once per loop turn (see .cork)
    spin = BusyPoll(limits.busy_poll_s) if limits.busy_poll_s > 0 else None  # see .spin
    return lambda: FastProtocol(hooks, fallback, conns, limits, cork, spin)


class FastProtocol(asyncio.Protocol):
    def __init__(
        self,
        hooks: Hooks,
        fallback: Callable[[], asyncio.Protocol],
        conns: set[Any],
        limits: Limits,
        cork: Cork | None = None,
        spin: BusyPoll | None = None,
    ) -> None:
        self._hooks = hooks
        self._spin = spin
        self._cork = cork
        self._out: list[bytes] = []  # answers kept until the cork flushes (see .cork)
        self._kept = 0
        self._fallback = fallback
        self._conns = conns
        self._limits = limits
        self._delays = {IDLE: limits.keepalive_timeout, HEAD: limits.header_timeout}
        self._delays[BODY] = limits.body_timeout
        self.conn = Connection(limits.max_body, hooks.accept)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_kind = _NO_TIMER
        self._active = 0.0  # loop time of the last answer (the keep-alive timer counts from it)
        self._loop = asyncio.get_running_loop()  # made by the loop's listener, inside the loop
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self._closing = False
        self._read_paused = False
        self._write_paused = False
        self._task: asyncio.Task[None] | None = None
        self._starting = False  # inside _start's eager task start (3.12+)
        # Python < 3.12: the handler coroutine driven by _step and the future it awaits.
        self._coro: Coroutine[Any, Any, Reply] | None = None
        # The handler's context on 3.11 (driven by hand): its own copy, as a Task's is, so a
        # context variable it sets (a trace's current span) is still set after an await.
        self._context = contextvars.Context()
        self._waiting: Any = None
        self.idle: asyncio.Future[None] | None = None  # set by close_all: resolved after the answer
        self._release: Callable[[], None] | None = None  # what ``admit`` gave for the body arriving

    # ------------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, (tuple, list)) and peer:
            self.conn.remote = str(peer[0])
        self._conns.add(self)
        self._active = self._loop.time()
        self._arm(HEAD)  # the first request head is due within header_timeout too

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self._out.clear()
        self._disarm()
        self._give_back()
        self._conns.discard(self)
        if self.busy and self._limits.cancel_on_lost:
            if self._task is not None:
                self._task.cancel()
            elif self._coro is not None and self._waiting is not None:
                # Throw into the handler at its await; the future it awaited is left alone
                # (it may be shared, e.g. a batch commit) and its late callback is ignored.
                self._waiting = None
                self._step(self._coro, True, False, asyncio.CancelledError())

    def data_received(self, data: bytes) -> None:
        self.conn.buf += data
        if not self.busy and not self._write_paused:
            self._next()
        elif len(self.conn.buf) > HIGH_WATER and not self._read_paused and self.transport is not None:
            self._read_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # close our side too (pending answers are dropped, like aiohttp does)

    def pause_writing(self) -> None:
        self._write_paused = True  # the client does not read: answer nothing more for now

    def resume_writing(self) -> None:
        self._write_paused = False
        if not self.busy:
            self._next()

    def close_when_idle(self) -> None:
        """Shutdown: close now if idle, else after the answer in progress."""
        self._closing = True
        if not self.busy and self.transport is not None:
            self.flush_out()
            self.transport.close()

    # ------------------------------------------------------------------ timers
    def _arm(self, kind: int) -> None:
        """Start the timer for ``kind`` unless it already runs: more bytes never extend it."""
        if self._timer_kind == kind:
            return
        self._disarm()
        delay = self._delays[kind]
        if delay > 0:
            self._timer = self._loop.call_later(delay, self._expired)
            self._timer_kind = kind

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_kind = _NO_TIMER

    def _expired(self) -> None:
        kind, self._timer, self._timer_kind = self._timer_kind, None, _NO_TIMER
        t = self.transport
        if t is None or self.busy:
            return  # while a handler works nothing is timed; _next arms afresh after it
        if kind == IDLE:
            left = self._active + self._delays[IDLE] - self._loop.time()
            if left > 0:  # answered something since it was armed: wait the rest
                self._timer = self._loop.call_later(left, self._expired)
                self._timer_kind = IDLE
                return
        elif kind == BODY:
            late = self._hooks.late
            pending = self.conn.pending() if late is not None else None
            if late is None or pending is None:
                self._hand_over()  # aiohttp times the body out with its own timer
            else:
                # One body_timeout from the head, answered here: handing over would start
                # aiohttp's timer afresh and double the wait.
                self._refuse(late(pending[0]), pending[1])
            return
        else:
            delay = self._delays[kind]
            # An idle connection (nothing sent) is routine: DEBUG; a head left half-sent, INFO.
            level = logging.INFO if self.conn.buf else logging.DEBUG
            log.log(
                level, "closing connection from %s: no request head within %.3g s", self.conn.remote, delay
            )
        self.flush_out()
        self.transport = None
        self._conns.discard(self)
        t.close()

    # ------------------------------------------------------------------ requests
    def _next(self) -> None:
        """Answer every complete request received, in order, until one has to wait; then
        time whatever the connection waits for."""
        conn = self.conn
        while self.transport is not None and not self.busy:
            if self._write_paused:
                return
            ready = conn.next()
            if type(ready) is int:
                if ready == HAND_OVER:
                    self._hand_over()
                    return
                if ready == BODY and not conn.asked_early and not self._ask_early():
                    return
                self._arm(ready)  # IDLE runs on across requests: _expired checks _active
                break
            req, query, close = cast(Ready, ready)
            if self._release is not None:
                self._give_back()  # the body is in: it no longer counts as being received
            if self._timer_kind >= HEAD:
                self._disarm()  # the request is complete: its head/body deadline is met
            self._start(self._hooks.serve(req, query), close)
        if self._read_paused and not self.busy and self.transport is not None:
            self._read_paused = False
            self.transport.resume_reading()

    def _ask_early(self) -> bool:
        """The body is still arriving: can the request be refused without it (``early``), and
        may it be received (``admit``)? False when the connection was answered or handed over."""
        conn = self.conn
        conn.asked_early = True
        hooks = self._hooks
        if hooks.early is None and hooks.admit is None:
            return True
        pending = conn.pending()
        if pending is None:
            return True
        reply = hooks.early(pending[0]) if hooks.early is not None else None
        if reply is not None:
            self._refuse(reply, pending[1])
            return False
        if hooks.admit is not None:
            release = hooks.admit(pending[0])
            if release is None:
                self._hand_over()  # aiohttp answers it (the same limit: 429)
                return False
            self._release = release
        return True

    def _give_back(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def _start(self, coro: Coroutine[Any, Any, Reply], close: bool) -> None:
        """Run the handler at once, in this callback (no task hop)."""
        self.busy = True
        if self._spin is not None:
            self._spin.waiting += 1  # until _answer: a call answered at once never counts
        if _EAGER_TASKS:
            # loop= explicitly: an eager Task made without one fails (AttributeError on 3.12, 3.13).
            self._starting = True
            try:
                task = asyncio.Task(self._run(coro, close), loop=self._loop, eager_start=True)  # type: ignore[call-arg]
            finally:
                self._starting = False
            if not task.done():
                self._task = task  # keep it referenced while it waits
            return
        self._context = contextvars.copy_context()
        self._step(coro, close, False)

    async def _run(self, coro: Coroutine[Any, Any, Reply], close: bool) -> None:
        """Python 3.12+: the handler in an eager task, answered in the task's own step (not
        from a done callback, a loop hop later). A client that leaves cancels the task, and
        with it the future the handler awaits: a future other requests share is awaited
        shielded (the queue's long poll) or refuses to be cancelled (the queue's writes)."""
        try:
            reply = await coro
        except asyncio.CancelledError:
            self._answer(_ERROR, True)  # the client left (connection_lost): nobody to answer
            return
        except Exception:
            log.exception("request failed")
            self._answer(_ERROR, True)
            return
        resume = not self._starting  # answered later than in the callback that started it
        self._answer(reply, close, keep=not resume)
        if resume and not self.busy:
            self._next()

    def _step(
        self,
        coro: Coroutine[Any, Any, Reply],
        close: bool,
        resume: bool,
        throw: BaseException | None = None,
    ) -> None:
        """Python 3.11 (no eager tasks): drive the handler by hand. It awaits only futures
        (a commit, a worker's answer, a long-poll wake-up, a timer); each resumes it straight
        from the future's done callback, so an answer is written one loop hop after the
        future resolves instead of three (task wake-up, task end, done callback), no Task
        object is made per call, and a client that leaves gets a CancelledError thrown at
        the await without cancelling the future, which other requests may share (a Task's
        cancel would cancel it)."""
        self._coro = coro
        try:
            run = self._context.run
            yielded = run(coro.send, None) if throw is None else run(coro.throw, throw)
        except StopIteration as stop:
            self._answer(stop.value, close, keep=not resume)
        except asyncio.CancelledError:
            self._answer(_ERROR, True)  # the client left (connection_lost): nobody to answer
        except Exception:
            log.exception("request failed")
            self._answer(_ERROR, True)
        else:
            if yielded is None:  # a bare yield (sleep(0)): run again on the next iteration
                self._waiting = True
                self._loop.call_soon(self._resume, coro, close, True)
            elif getattr(yielded, "_asyncio_future_blocking", None) is None:
                coro.close()  # not an asyncio future: nothing here awaits such a thing
                log.error("request handler awaited %r", type(yielded).__name__)
                self._answer(_ERROR, True)
            else:
                # The protocol every asyncio future awaiter follows (as a Task does).
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

    def _answer(self, reply: Reply, close: bool, keep: bool = False) -> None:
        """Write ``reply``. ``keep``: it was answered at once, while the loop reads what
        arrived: write it with the turn's other answers (see .cork). An answer that waited
        for something (a worker, a commit) comes with the others that waited for the same
        thing, and goes at once."""
        spin = self._spin
        if spin is not None:
            if self.busy:
                spin.waiting -= 1
            spin.arm()
        self.busy = False
        self._task = None
        self._coro = self._waiting = None
        if self.idle is not None and not self.idle.done():
            self.idle.set_result(None)
        t = self.transport
        if t is None:
            return
        if self._timer_kind == IDLE:
            self._active = self._loop.time()
        close = close or self._closing
        data = encode_reply(reply, close)
        if close or not keep or self._cork is None:
            self.flush_out()
            t.write(data)
            if close:
                t.close()
                self.transport = None
            return
        if not self._out:
            self._cork.add(self)
        self._out.append(data)
        self._kept += len(data)
        if self._kept > MAX_KEPT:
            self.flush_out()

    def flush_out(self) -> None:
        """Write the answers kept for the cork (in order), now."""
        out = self._out
        if not out:
            return
        t = self.transport
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._kept = 0
        if t is not None and not t.is_closing():
            t.write(data)

    # ------------------------------------------------------------------ leaving the fast path
    def _detach(self) -> tuple[asyncio.Transport | None, bytes]:
        """Stop serving this connection: -> its transport (None if already gone) and the
        bytes received but not consumed, for whatever protocol takes it over."""
        self.flush_out()  # what was answered on it goes first
        t = self.transport
        if t is None:
            return None, b""
        self.transport = None
        self._disarm()
        self._give_back()
        self._conns.discard(self)
        data, self.conn.buf = bytes(self.conn.buf), bytearray()
        if self._read_paused:
            self._read_paused = False
            t.resume_reading()
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

    def flush_out(self) -> None:
        """Nothing is kept here: its one answer was written when the connection came here."""

    def close_when_idle(self) -> None:
        self._timer.cancel()
        self._conns.discard(self)
        t, self.transport = self.transport, None
        if t is not None:
            t.close()


async def close_all(conns: set[Any], timeout: float) -> None:
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
            c.flush_out()
            c.transport.close()
