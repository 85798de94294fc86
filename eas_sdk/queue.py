"""QueueClient / AsyncQueueClient / Watcher: the EAS queue service (put, get, watch, commit).

Drop-in for ``eas_prediction.QueueClient`` (0.36) with these deliberate differences:

* HTTP calls follow the SDK retry rules (``eas_sdk._core.retry``): transport errors,
  450/5xx and 429-with-Retry-After are retried with jittered back-off; **a 4xx is
  never retried** (the reference retried even 404 six times). Failures raise the
  ``eas_sdk.errors`` subclasses of ``PredictException``.
* ``put`` sends an ``X-Request-Id``, so a put retried after a lost response is
  stored once and returns the same index.
* ``get(auto_delete=True)`` is retried only when connecting failed: once it may
  have reached the server (read timeout, dropped or cut-off response) a retry
  could lose the records the server deleted, so the error is raised.
* One running watcher per client (sync and async); a frame that does not decode
  is a broken stream (reconnect), never an exception out of ``run()``.
* ``get`` waits for the server's long-poll: its read timeout is the client timeout
  or the ``timeout`` argument plus one second, whichever is longer.
* The watcher uses the ``websockets`` library, pings every 2 s, notices a dead
  connection within ``ping_interval + ping_timeout``, and reconnects with jittered
  back-off (at most 2 s) while it is not closed. Records delivered but not
  committed before a drop come back (the server's consumer group keeps them);
  committed records never do. A 4xx at the handshake (bad token, bad window) is
  raised instead of retried forever.
* ``close()`` sends a close frame; the reference aborted the TCP connection.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import http.client
import logging
import random
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from types import TracebackType
from typing import Any

from ._core import constants as C
from ._core import queue as core
from ._core.queue import DataFrame, to_pandas
from ._core.retry import FailureKind, RetryBudget, RetryPolicy
from .errors import ConnectError, PredictException, TimeoutError, error_for_status

__all__ = ["AsyncQueueClient", "AsyncWatcher", "DataFrame", "QueueClient", "Watcher", "to_pandas"]

DEFAULT_TIMEOUT_MS = 5000
PING_INTERVAL = 2.0
PING_TIMEOUT = 2.0
RECONNECT_BASE = 0.1
RECONNECT_CAP = 2.0
WATCH_MAX_QUEUE = 4096

_log = logging.getLogger("eas_sdk.queue")

_NOT_REPEATABLE = "the request may have reached the server, which may have deleted the records it read"


def _reconnect_delay(attempt: int, rng: random.Random) -> float:
    # Full jitter, capped at 2 s, so a fleet of watchers does not reconnect in lockstep.
    return rng.random() * min(RECONNECT_CAP, RECONNECT_BASE * (1 << min(attempt, 10)))


def _status_error(status: int, body: bytes, headers: Mapping[str, str]) -> PredictException:
    return error_for_status(status, body.decode("utf-8", "replace"), dict(headers))


class _Base:
    """Settings shared by the sync and async clients (no I/O)."""

    def __init__(self, endpoint: str = "", queue_name: str = "", custom_url: str = "") -> None:
        self.endpoint = endpoint
        self.queue_name = queue_name
        self.service_name = queue_name
        self.custom_url = custom_url
        self.path_suffix = ""
        self.token: str | None = None
        self.uid = str(uuid.uuid4())
        self.gid = C.DEFAULT_QUEUE_GROUP
        self.timeout_ms = DEFAULT_TIMEOUT_MS
        self.content_type = ""
        self.extra_headers: dict[str, str] = {}
        self.retry_policy = RetryPolicy()
        self.budget = RetryBudget()
        self.logger: logging.Logger | None = _log
        self.ping_interval = PING_INTERVAL
        self.ping_timeout = PING_TIMEOUT
        self._base: str | None = None
        self._rng = random.Random()

    # --- reference API --------------------------------------------------------
    def set_token(self, token: str) -> None:
        self.token = token

    def set_timeout(self, timeout: float) -> None:
        """Per-attempt timeout in milliseconds (like the reference)."""
        self.timeout_ms = float(timeout)

    def set_logger(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger

    def set_retry_count(self, retries: int) -> None:
        self.retry_policy = dataclasses.replace(self.retry_policy, retries=int(retries))

    # The reference's plain attributes that programs assign, routed to the settings.
    @property
    def timeout(self) -> float:
        """Per-attempt timeout in milliseconds (``set_timeout``)."""
        return self.timeout_ms

    @timeout.setter
    def timeout(self, value: float) -> None:
        self.set_timeout(value)

    @property
    def retry_count(self) -> int:
        """Retries after the first attempt (``set_retry_count``)."""
        return self.retry_policy.retries

    @retry_count.setter
    def retry_count(self, value: int) -> None:
        self.set_retry_count(value)

    def set_content_type(self, content_type: str) -> None:
        self.content_type = content_type

    def add_extra_headers(self, headers: Mapping[str, str]) -> None:
        self.extra_headers.update(headers)

    def _init(self, uid: str | None, gid: str, custom_url: str, path_suffix: str) -> None:
        self.uid = str(uuid.uuid4()) if uid is None else uid
        self.gid = gid
        if custom_url:
            self.custom_url = custom_url
        self.path_suffix = path_suffix
        self._base = None

    @property
    def base_url(self) -> str:
        if self._base is None:
            self._base = core.base_url(self.endpoint, self.queue_name, self.custom_url, self.path_suffix)
        return self._base

    def _headers(self, accept_protobuf: bool = False) -> dict[str, str]:
        h = core.identity_headers(self.token, self.uid, self.gid, self.content_type, self.extra_headers)
        if accept_protobuf:
            h.update(core.PROTOBUF_ACCEPT)
        return h

    def __repr__(self) -> str:  # never the token
        return f"{type(self).__name__}(queue={self.queue_name!r}, uid={self.uid!r}, gid={self.gid!r})"


# ============================================================================ sync


class _Response:
    __slots__ = ("data", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], data: bytes) -> None:
        self.status = status
        self.headers = headers
        self.data = data


class _StaleConnection(Exception):
    """A pooled keep-alive connection was closed by the server before any response byte."""


class _NotSent(Exception):
    """Connecting failed: nothing of the request left this process (safe to retry any call)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _dropped(sock: Any) -> bool:
    """Whether an idle pooled socket is readable, i.e. closed by the server (or sent junk)."""
    from urllib3.util.wait import wait_for_read

    try:
        return bool(wait_for_read(sock, timeout=0.0))
    except (OSError, ValueError):
        return True


def encode_headers(headers: Mapping[str, str]) -> bytes:
    return "".join([f"{k}: {v}\r\n" for k, v in headers.items()]).encode("latin-1")


class _RawConnection:
    """One keep-alive HTTP/1.1 connection spoken directly over a socket (plain http only).

    A queue call is a tiny request/response pair; writing the request in one
    ``sendall`` and parsing the answer with bytes operations costs a fraction of
    http.client (about 25 us against 100 us per call here), which is most of a
    one-record put -> get -> commit cycle.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.hostport = f"{host}:{port}".encode("ascii")
        self.sock: socket.socket | None = None
        self._buf = b""
        self._timeout: float | None = None
        self.started = False  # a byte of the current response has arrived

    def connect(self, timeout: float) -> None:
        self.sock = socket.create_connection((self.host, self.port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._timeout = timeout

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None
        self._buf = b""

    def _recv(self) -> bytes:
        assert self.sock is not None
        chunk = self.sock.recv(262144)
        if not chunk:
            raise http.client.RemoteDisconnected("connection closed by the server")
        self.started = True
        return chunk

    def roundtrip(
        self,
        method: str,
        target: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
        head: bytes = b"",
    ) -> tuple[int, dict[str, str], bytes, bool]:
        """``head``: header lines already encoded (the client's fixed ones); ``headers``: the rest."""
        self.started = False
        if self.sock is None:
            self.connect(timeout)
        elif timeout != self._timeout:
            self.sock.settimeout(timeout)
            self._timeout = timeout
        parts = [f"{method} {target} HTTP/1.1\r\nHost: ".encode("latin-1"), self.hostport, b"\r\n", head]
        if headers:
            parts.append(encode_headers(headers))
        if body is not None or method in ("POST", "PUT"):
            parts.append(b"Content-Length: %d\r\n" % len(body or b""))
        parts.append(b"\r\n")
        if body:
            parts.append(body)
        self.sock.sendall(b"".join(parts))  # type: ignore[union-attr]
        buf = self._buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buf) > 65536:
                raise http.client.HTTPException("response head too large")
            buf += self._recv()
        head, buf = buf[:end], buf[end + 4 :]
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        status = int(rest[:3])
        rh: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            rh[k.strip()] = v.strip()
        lower = {k.lower(): v for k, v in rh.items()}
        will_close = lower.get("connection", "").lower() == "close" or version == "HTTP/1.0"
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            data = b""
        elif "chunked" in lower.get("transfer-encoding", "").lower():
            data, buf = self._chunked(buf)
        elif "content-length" in lower:
            n = int(lower["content-length"])
            while len(buf) < n:
                buf += self._recv()
            data, buf = buf[:n], buf[n:]
        else:  # delimited by the end of the connection
            chunks = [buf]
            with contextlib.suppress(http.client.RemoteDisconnected):
                while True:
                    chunks.append(self._recv())
            data, buf, will_close = b"".join(chunks), b"", True
        self._buf = buf
        if will_close:
            self.close()
        return status, rh, data, will_close

    def _chunked(self, buf: bytes) -> tuple[bytes, bytes]:
        out: list[bytes] = []
        while True:
            while b"\r\n" not in buf:
                buf += self._recv()
            size_line, _, buf = buf.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(buf) < size + 2:
                buf += self._recv()
            out.append(buf[:size])
            buf = buf[size + 2 :]
            if size == 0:
                while not buf.startswith(b"\r\n"):  # trailers, then the final CRLF
                    while b"\r\n" not in buf:
                        buf += self._recv()
                    if buf.startswith(b"\r\n"):
                        break
                    buf = buf.partition(b"\r\n")[2]
                return b"".join(out), buf[2:]


class _HTTPPool:
    """Keep-alive connections to one origin: raw HTTP/1.1 for http, ``http.client`` for https."""

    def __init__(self, base_url: str, maxsize: int) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        self.maxsize = maxsize
        self._idle: list[Any] = []
        self._lock = threading.Lock()

    def _roundtrip(
        self,
        conn: Any,
        method: str,
        target: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
        fixed: tuple[dict[str, str], bytes] | None,
    ) -> tuple[int, Mapping[str, str], bytes, bool]:
        if isinstance(conn, _RawConnection):
            if fixed is None:
                return conn.roundtrip(method, target, body, headers, timeout)
            return conn.roundtrip(method, target, body, headers, timeout, fixed[1])
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        conn.request(method, target, body=body, headers={**fixed[0], **headers} if fixed else dict(headers))
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, resp.headers, data, bool(resp.will_close)

    def request(
        self,
        method: str,
        target: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
        fixed: tuple[dict[str, str], bytes] | None = None,
        idempotent: bool = True,
    ) -> _Response:
        """``fixed``: (headers, the same encoded) sent with every call; ``headers``: this call's.

        Raises :class:`_NotSent` when connecting failed and :class:`_StaleConnection` when a
        reused connection died before any response byte. For a call that must not be
        repeated (``idempotent=False``), an idle connection the server has already
        closed is noticed before sending and replaced.
        """
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        reused = conn is not None
        if conn is not None and not idempotent and _dropped(conn.sock):
            conn.close()
            reused = False
        if conn is None:
            if self.https:
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
            else:
                conn = _RawConnection(self.host, self.port)
        if conn.sock is None:
            try:
                if isinstance(conn, _RawConnection):
                    conn.connect(timeout)
                else:
                    conn.timeout = timeout
                    conn.connect()
            except OSError as exc:
                conn.close()
                raise _NotSent(exc) from None
        try:
            status, rh, data, will_close = self._roundtrip(
                conn, method, target, body, headers, timeout, fixed
            )
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            conn.close()
            if isinstance(conn, _RawConnection):
                started = conn.started
            else:  # http.client: RemoteDisconnected means no status line; a reset may be mid-body
                started = not isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError))
            if reused and not started:
                raise _StaleConnection(str(exc)) from None
            raise
        except BaseException:
            conn.close()
            raise
        if will_close:
            conn.close()
        else:
            with self._lock:
                if len(self._idle) < self.maxsize:
                    self._idle.append(conn)
                    conn = None
            if conn is not None:
                conn.close()
        return _Response(status, rh, data)

    def clear(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()


class QueueClient(_Base):
    """Blocking queue client (thread-safe; one watcher at a time per client)."""

    def __init__(self, endpoint: str = "", queue_name: str = "", custom_url: str = "", **kwargs: Any) -> None:
        super().__init__(endpoint, queue_name, custom_url)
        self.max_connections = int(kwargs.get("max_connections", 10))
        self._http: _HTTPPool | None = None
        self._path = ""
        self.watch_lock = threading.Lock()
        self._watcher: Watcher | None = None
        self._fixed: dict[tuple[Any, ...], tuple[dict[str, str], bytes]] = {}

    @property
    def max_connection_count(self) -> int:
        """Pooled keep-alive connections (``max_connections``); takes effect at ``init()``."""
        return self.max_connections

    @max_connection_count.setter
    def max_connection_count(self, value: int) -> None:
        self.max_connections = int(value)

    def _fixed_headers(self, accept_protobuf: bool) -> tuple[dict[str, str], bytes]:
        """The headers of every call, encoded once per distinct setting (they are re-read each call)."""
        key = (
            self.token,
            self.uid,
            self.gid,
            self.content_type,
            accept_protobuf,
            *self.extra_headers.items(),
        )
        got = self._fixed.get(key)
        if got is None:
            if len(self._fixed) > 8:
                self._fixed.clear()
            h = self._headers(accept_protobuf)
            got = self._fixed[key] = (h, encode_headers(h))
        return got

    def init(
        self,
        uid: str | None = None,
        gid: str = C.DEFAULT_QUEUE_GROUP,
        custom_url: str = "",
        path_suffix: str = "",
    ) -> None:
        self._init(uid, gid, custom_url, path_suffix)
        if self._http is not None:
            self._http.clear()
        self._http = _HTTPPool(self.base_url, self.max_connections)
        # Requests carry origin-form targets (path + query).
        parts = urllib.parse.urlsplit(self.base_url)
        self._path = parts.path + (f"?{parts.query}" if parts.query else "")

    # --- transport -------------------------------------------------------------
    def _request(
        self,
        method: str,
        query: Mapping[str, Any],
        body: bytes | None = None,
        accept_protobuf: bool = False,
        read_timeout: float | None = None,
        extra: Mapping[str, str] | None = None,
        idempotent: bool = True,
    ) -> _Response:
        """One queue call with the SDK retry rules.

        ``idempotent=False`` (a ``get`` that deletes what it reads): once the request may
        have reached the server (a read timeout, a dropped or cut-off response) it is
        not retried, since the server may have deleted the records already and a retry
        would lose them; only a failure to connect is retried.
        """
        if self._http is None:
            self.init(self.uid, self.gid)
        assert self._http is not None
        target = core.build_url(self._path, query)
        fixed = self._fixed_headers(accept_protobuf)
        headers = extra or {}
        t = self.timeout_ms / 1000.0
        attempt_timeout = max(t, read_timeout or 0.0)
        policy, budget = self.retry_policy, self.budget
        deadline = time.monotonic() + max(policy.total_timeout(t), attempt_timeout + t)
        budget.on_call()
        retry = 0
        stale = policy.stale_connection_retries
        while True:
            remaining = deadline - time.monotonic()
            sent = True
            try:
                resp = self._http.request(method, target, body, headers, attempt_timeout, fixed, idempotent)
            except _NotSent as exc:
                kind = _failure_kind(exc.cause)
                exc_text = f"{type(exc.cause).__name__}: {exc.cause}"
                sent = False
            except _StaleConnection:
                if stale > 0 and idempotent:  # an idle connection the server had closed: resend at once, free
                    stale -= 1
                    continue
                kind = FailureKind.DISCONNECTED
                exc_text = "connection closed by the server"
            except (OSError, http.client.HTTPException) as exc:
                kind = _failure_kind(exc)
                exc_text = f"{type(exc).__name__}: {exc}"
            else:
                status = resp.status
                if 200 <= status < 300:
                    return resp
                decision = policy.after_status(status, resp.headers, retry, remaining, self._rng, time.time())
                if decision.retry and budget.try_spend(time.monotonic()):
                    retry += 1
                    time.sleep(decision.delay)
                    continue
                raise _status_error(status, resp.data, resp.headers)
            cls = TimeoutError if kind is FailureKind.TIMEOUT else ConnectError
            if sent and not idempotent:
                raise cls(f"queue {method} failed: {exc_text} (not retried: {_NOT_REPEATABLE})", code=502)
            decision = policy.after_failure(kind, retry, remaining, self._rng)
            if decision.retry and budget.try_spend(time.monotonic()):
                retry += 1
                time.sleep(decision.delay)
                continue
            raise cls(f"queue {method} failed: {exc_text}", code=502)

    # --- operations ------------------------------------------------------------
    def put(self, data: bytes | str, tags: Mapping[str, str] | None = None) -> tuple[str, str]:
        """Append a record; returns (index as a string, request id)."""
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        rid = str(uuid.uuid4())
        resp = self._request("POST", core.check_tags(tags), body, extra={C.HEADER_REQUEST_ID: rid})
        return core.parse_put(resp.data, resp.headers)

    def get(
        self,
        request_id: str | None = None,
        index: int | str = 0,
        length: int = 1,
        timeout: str = "5s",
        auto_delete: bool = True,
        tags: Mapping[str, str] | None = None,
    ) -> list[DataFrame]:
        query = core.get_query(request_id, index, length, timeout, auto_delete, tags or {})
        wait = core.duration_seconds(timeout)
        resp = self._request(
            "GET", query, accept_protobuf=True, read_timeout=wait + 1.0, idempotent=not auto_delete
        )
        return core.parse_get(resp.data)

    def attributes(self) -> dict[str, Any]:
        return core.parse_json(self._request("GET", core.ATTRS_QUERY).data)

    def search(self, index: int | str) -> dict[str, Any]:
        """Pending state of a record: {} for an invalid or unknown index (like the reference)."""
        if not core.check_index(index):
            return {}
        try:
            return core.parse_json(self._request("GET", core.search_query(index)).data)
        except PredictException as exc:
            if self.logger:
                self.logger.debug("search %s: %s", index, exc)
            return {}

    def delete(self, indexes: int | str | list[int | str]) -> str:
        return self._request("DELETE", core.indexes_query(core.index_list(indexes))).data.decode("utf-8")

    def commit(self, indexes: int | str | list[int | str]) -> bytes:
        """Acknowledge records for this client's group (idempotent; several indexes per call)."""
        return self._request("PUT", core.indexes_query(core.index_list(indexes)), b"").data  # type: ignore[no-any-return]

    def truncate(self, index: int | str) -> bytes:
        """Delete every record with an index below ``index``."""
        return self._request("DELETE", core.truncate_query(index)).data  # type: ignore[no-any-return]

    def watch(
        self,
        index: int,
        window: int,
        index_only: bool = False,
        auto_commit: bool = False,
        tags: Mapping[str, str] | None = None,
    ) -> Watcher:
        if self._http is None:
            self.init(self.uid, self.gid)
        query = core.watch_query(index, window, index_only, auto_commit, tags)
        url = core.build_url(self.base_url, query, websocket=True)
        return Watcher(self, url, self._headers(accept_protobuf=True))

    # --- lifecycle -------------------------------------------------------------
    def close(self) -> None:
        w = self._watcher
        if w is not None:
            w.close()
        if self._http is not None:
            self._http.clear()

    def destroy(self) -> None:
        self.close()

    def __enter__(self) -> QueueClient:
        if self._http is None:
            self.init(self.uid, self.gid)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _failure_kind(exc: BaseException) -> FailureKind:
    if isinstance(exc, builtins.TimeoutError):
        return FailureKind.TIMEOUT
    if isinstance(exc, (ConnectionRefusedError, socket.gaierror)):
        return FailureKind.CONNECT
    return FailureKind.DISCONNECTED


def _connect_options(client: Any, headers: Any) -> dict[str, Any]:
    """``websockets`` connect() options shared by the sync and the async watcher."""
    return {
        "additional_headers": headers,
        "compression": None,
        "max_size": None,
        # Frames are small and many: a deep receive queue keeps the socket drained
        # instead of pausing reads every 16 messages.
        "max_queue": WATCH_MAX_QUEUE,
        "proxy": None,
        "open_timeout": max(1.0, client.timeout_ms / 1000.0),
        "ping_interval": client.ping_interval,
        "ping_timeout": client.ping_timeout,
        "close_timeout": 1.0,
    }


def _handshake_error(exc: BaseException) -> PredictException | None:
    """A 4xx answer to the upgrade is final (raised); anything else is worth a reconnect."""
    from websockets.exceptions import InvalidStatus

    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if 400 <= status < 500 and status not in (408, 429):
            body = exc.response.body or b""
            return _status_error(status, body, dict(exc.response.headers.raw_items()))
    return None


class Watcher:
    """Records pushed by the server over a WebSocket; iterate ``run()``, then ``close()``."""

    def __init__(self, client: QueueClient, url: str, headers: dict[str, str]) -> None:
        self.client = client
        self.url = url
        self.headers = headers
        self.closed = False
        self.reconnects = 0
        self._ws: Any = None
        self._lock = threading.Lock()

    def run(self) -> Iterator[DataFrame]:
        from google.protobuf.message import DecodeError
        from websockets.exceptions import ConnectionClosed, WebSocketException
        from websockets.sync.client import connect

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
                    ws = connect(
                        self.url,
                        **_connect_options(self.client, self.headers),
                        legacy=True,  # one direct connection: this class does its own reconnects
                    )
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
                except (ConnectionClosed, OSError, ValueError, TimeoutError, DecodeError) as exc:
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


# ============================================================================ async


class AsyncQueueClient(_Base):
    """The asyncio twin of QueueClient (aiohttp for HTTP, websockets for watch)."""

    def __init__(self, endpoint: str = "", queue_name: str = "", custom_url: str = "", **kwargs: Any) -> None:
        super().__init__(endpoint, queue_name, custom_url)
        self._session: Any = None
        self._watcher: AsyncWatcher | None = None  # one running watcher per client, as QueueClient

    def init(
        self,
        uid: str | None = None,
        gid: str = C.DEFAULT_QUEUE_GROUP,
        custom_url: str = "",
        path_suffix: str = "",
    ) -> None:
        self._init(uid, gid, custom_url, path_suffix)

    async def _get_session(self) -> Any:
        if self._session is None or self._session.closed:
            import aiohttp

            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=100),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
            # aiohttp silently re-sends a GET/PUT/DELETE once when the connection drops
            # before the response; our retry rules decide instead (a get that deletes
            # what it reads must not be repeated). No public switch: the attribute
            # aiohttp reads is set when it exists.
            if hasattr(self._session, "_retry_connection"):
                self._session._retry_connection = False
        return self._session

    async def _request(
        self,
        method: str,
        query: Mapping[str, Any],
        body: bytes | None = None,
        accept_protobuf: bool = False,
        read_timeout: float | None = None,
        extra: Mapping[str, str] | None = None,
        idempotent: bool = True,
    ) -> tuple[int, bytes, Mapping[str, str]]:
        """One queue call with the SDK retry rules; see ``QueueClient._request`` for ``idempotent``."""
        import aiohttp

        not_sent = (aiohttp.ClientConnectorError, getattr(aiohttp, "ConnectionTimeoutError", ()))

        session = await self._get_session()
        url = core.build_url(self.base_url, query)
        headers = self._headers(accept_protobuf)
        if extra:
            headers.update(extra)
        t = self.timeout_ms / 1000.0
        attempt_timeout = max(t, (read_timeout or 0.0))
        policy, budget = self.retry_policy, self.budget
        deadline = time.monotonic() + max(policy.total_timeout(t), attempt_timeout + t)
        budget.on_call()
        retry = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                ct = aiohttp.ClientTimeout(total=attempt_timeout)
                async with session.request(
                    method, url, data=body, headers=headers, timeout=ct, allow_redirects=False
                ) as resp:
                    status, data, rh = resp.status, await resp.read(), resp.headers
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                if isinstance(exc, asyncio.TimeoutError):
                    kind = FailureKind.TIMEOUT
                elif isinstance(exc, aiohttp.ClientConnectorError):
                    kind = FailureKind.CONNECT
                else:
                    kind = FailureKind.DISCONNECTED
                cls = TimeoutError if kind is FailureKind.TIMEOUT else ConnectError
                if not idempotent and not isinstance(exc, not_sent):
                    # Only a failed connect is known not to have reached the server (a
                    # total timeout cannot tell connect from read, so it is final too).
                    text = f"{type(exc).__name__}: {exc} (not retried: {_NOT_REPEATABLE})"
                    raise cls(f"queue {method} failed: {text}", code=502) from None
                decision = policy.after_failure(kind, retry, remaining, self._rng)
                if decision.retry and budget.try_spend(time.monotonic()):
                    retry += 1
                    await asyncio.sleep(decision.delay)
                    continue
                raise cls(f"queue {method} failed: {type(exc).__name__}: {exc}", code=502) from None
            if 200 <= status < 300:
                return status, data, rh
            decision = policy.after_status(status, rh, retry, remaining, self._rng, time.time())
            if decision.retry and budget.try_spend(time.monotonic()):
                retry += 1
                await asyncio.sleep(decision.delay)
                continue
            raise _status_error(status, data, rh)

    async def put(self, data: bytes | str, tags: Mapping[str, str] | None = None) -> tuple[str, str]:
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        _, out, headers = await self._request(
            "POST", core.check_tags(tags), body, extra={C.HEADER_REQUEST_ID: str(uuid.uuid4())}
        )
        return core.parse_put(out, headers)

    async def get(
        self,
        request_id: str | None = None,
        index: int | str = 0,
        length: int = 1,
        timeout: str = "5s",
        auto_delete: bool = True,
        tags: Mapping[str, str] | None = None,
    ) -> list[DataFrame]:
        query = core.get_query(request_id, index, length, timeout, auto_delete, tags or {})
        wait = core.duration_seconds(timeout)
        _, out, _ = await self._request(
            "GET", query, accept_protobuf=True, read_timeout=wait + 1.0, idempotent=not auto_delete
        )
        return core.parse_get(out)

    async def attributes(self) -> dict[str, Any]:
        return core.parse_json((await self._request("GET", core.ATTRS_QUERY))[1])

    async def search(self, index: int | str) -> dict[str, Any]:
        if not core.check_index(index):
            return {}
        try:
            return core.parse_json((await self._request("GET", core.search_query(index)))[1])
        except PredictException:
            return {}

    async def delete(self, indexes: int | str | list[int | str]) -> str:
        out = (await self._request("DELETE", core.indexes_query(core.index_list(indexes))))[1]
        return out.decode("utf-8")

    async def commit(self, indexes: int | str | list[int | str]) -> bytes:
        return (await self._request("PUT", core.indexes_query(core.index_list(indexes)), b""))[1]

    async def truncate(self, index: int | str) -> bytes:
        return (await self._request("DELETE", core.truncate_query(index)))[1]

    def watch(
        self,
        index: int,
        window: int,
        index_only: bool = False,
        auto_commit: bool = False,
        tags: Mapping[str, str] | None = None,
    ) -> AsyncWatcher:
        query = core.watch_query(index, window, index_only, auto_commit, tags)
        url = core.build_url(self.base_url, query, websocket=True)
        return AsyncWatcher(self, url, self._headers(accept_protobuf=True))

    async def close(self) -> None:
        w = self._watcher
        if w is not None:
            await w.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncQueueClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class AsyncWatcher:
    """``async for df in client.watch(...)``; ``await watcher.close()`` to stop."""

    def __init__(self, client: AsyncQueueClient, url: str, headers: dict[str, str]) -> None:
        self.client = client
        self.url = url
        self.headers = headers
        self.closed = False
        self.reconnects = 0
        self._ws: Any = None
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
                    ws = await connect(self.url, **_connect_options(client, self.headers))
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
