"""PredictClient (urllib3, threads) and AsyncPredictClient (aiohttp, asyncio).

Both are thin drivers over the I/O-free core in ``eas_sdk._core``: settings live
in a :class:`~eas_sdk._core.request.ClientConfig`, each call is a
:class:`~eas_sdk._core.request.PredictCall` (URL, fresh signed headers, retry and
deadline decisions), endpoints come from :mod:`eas_sdk._core.endpoints`. The two
classes here only move bytes, sleep and run the direct-mode discovery refresh.

Drop-in for ``eas_prediction.PredictClient`` (0.36) with these deliberate
differences:

* ``retry_count`` / ``set_retry_count(n)`` is the number of **retries**: a call
  makes up to ``1 + n`` attempts (the original made ``n`` attempts in total and
  returned None for ``n == 0``; here ``0`` means exactly one attempt). Retries use
  full-jitter exponential back-off, a per-client retry budget and an overall
  deadline of ``timeout x attempts`` (at most 30 s), and also cover 450, 502, 503,
  504 and 429-with-Retry-After (the original retried only 500).
* https is verified (system CAs, or the PEM bundle given as ``ca_certs=``); a
  verification failure is final, never retried.
* Headers are built per attempt and never leak between calls (the original mutated
  a shared dict, so e.g. an old Authorization survived ``set_token('')``).
* ``Date`` is real GMT; https endpoints work; direct-mode URLs carry ``http://``;
  discovery has a timeout and keeps the last good list on failure.
* ``set_timeout`` stays in milliseconds (per attempt) and bounds the whole attempt:
  the wait for a pooled connection, connect, send and the complete response (the
  original bounded each socket read alone, so a trickling server could hold a call
  for ever). Nothing is retried once a response has started (D4).
* ``ENDPOINT_TYPE_VIPSERVER`` (an Alibaba-internal naming service reachable only
  inside Alibaba's network) is accepted as a constant but ``init()`` rejects it.
* The library adds no logging handlers; ``set_log_level`` sets the level of the
  ``eas_sdk.predict`` logger (shared by all clients).
* The connection pool blocks when full (``max_connection_count`` connections per
  endpoint, never more, in both clients) instead of opening throw-away extra
  connections; a connection idle for ``keepalive_expiry`` (10 s) is not reused.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import http.client
import logging
import math
import random
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Mapping
from types import MappingProxyType, TracebackType
from typing import Any

import urllib3
import urllib3.connection
import urllib3.exceptions as u3

from ._core.constants import (
    ENDPOINT_TYPE_DEFAULT,
    ENDPOINT_TYPE_DIRECT,
    ENDPOINT_TYPE_GATEWAY,
    ENDPOINT_TYPE_VIPSERVER,
)
from ._core.endpoints import (
    DISCOVERY_INTERVAL,
    DISCOVERY_TIMEOUT,
    FIRST_DISCOVERY_WAIT,
    DiscoveryError,
    EndpointSet,
    WarningLimiter,
    apply_discovery_response,
    discovery_url,
)
from ._core.request import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_TIMEOUT_MS,
    Attempt,
    ClientConfig,
    PredictCall,
    Step,
    mask_token,
    redact_url,
)
from ._core.retry import FailureKind, RetryBudget, RetryPolicy
from .errors import NoEndpointError, PredictException

__all__ = [
    "ENDPOINT_TYPE_DEFAULT",
    "ENDPOINT_TYPE_DIRECT",
    "ENDPOINT_TYPE_GATEWAY",
    "ENDPOINT_TYPE_VIPSERVER",
    "AsyncPredictClient",
    "PredictClient",
    "PredictException",
    "aiohttp_failure_kind",
    "request_body",
    "urllib3_failure_kind",
]

logger = logging.getLogger("eas_sdk.predict")

# Idle keep-alive connections are dropped after this long (below the 75 s of
# aiohttp servers, above the 5 s of uvicorn; a stale one is re-sent anyway).
DEFAULT_KEEPALIVE_EXPIRY = 10.0

# Bodies up to this size go out in the same send() as the request head.
COALESCE_MAX_BODY = 64 * 1024


class _CoalescingSend:
    """Connection mixin: send the request head and a small body in one ``sendall``.

    urllib3 sends the head (http.client's ``endheaders``) and then the body with
    two ``send`` calls, so every small request costs two syscalls, two loopback or
    network segments and often two reads by the server. Here the head is held
    back while a small bytes body is pending and goes out joined with it when the
    very next ``send`` is that body; any other next ``send`` (a chunked encoding of
    it, say) or the end of the request flushes the head alone first. The bytes on
    the wire are the same.
    """

    _pending_body: bytes | None = None
    _held_head: bytes | None = None

    def request(self, method: str, url: str, body: Any = None, headers: Any = None, **kwargs: Any) -> None:
        if type(body) is bytes and 0 < len(body) <= COALESCE_MAX_BODY:
            self._pending_body = body
        try:
            super().request(method, url, body, headers, **kwargs)  # type: ignore[misc]
            head = self._held_head
            if head is not None:  # the body never came: the head must still go out
                self._held_head = None
                super().send(head)  # type: ignore[misc]
        finally:
            self._pending_body = self._held_head = None

    def send(self, data: Any) -> None:
        body = self._pending_body
        if body is not None:
            head = self._held_head
            if head is None and type(data) is bytes:
                self._held_head = data  # the head: wait for the body
                return
            self._pending_body = self._held_head = None
            if head is not None:
                if data is body:
                    super().send(head + body)  # type: ignore[misc]
                    return
                super().send(head)  # type: ignore[misc]
        super().send(data)  # type: ignore[misc]


class _DeadlineSocketIO(socket.SocketIO):
    """The socket reader of one response: every recv waits only for what is left of the attempt.

    urllib3 applies its read timeout to each ``recv`` alone, so a server trickling a
    byte every so often could hold an attempt for ever. Here each read first sets the
    socket's timeout to the time left until the attempt's deadline, and raises
    ``TimeoutError`` (socket.timeout) once none is left: headers and body together take at most
    the attempt's budget. (One ``settimeout`` per ``recv``; a small answer is one.)
    """

    _deadline = math.inf

    def readinto(self, b: Any) -> int | None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out (attempt deadline)")
        self._sock.settimeout(left)  # type: ignore[attr-defined]
        return super().readinto(b)


class _DeadlineResponse(http.client.HTTPResponse):
    """http.client's response reading through a :class:`_DeadlineSocketIO`."""

    def __init__(
        self, sock: Any, deadline: float, debuglevel: int = 0, method: str | None = None, url: Any = None
    ) -> None:
        super().__init__(sock, debuglevel, method, url)
        if deadline < math.inf:
            raw = self.fp.raw  # the SocketIO that sock.makefile() made: make it deadline-aware
            raw.__class__ = _DeadlineSocketIO
            raw._deadline = deadline


class _AttemptConnection(_CoalescingSend):
    """Connection mixin: bounds a whole response read by a deadline, and knows if it was reused.

    * urllib3 sets ``self.timeout`` to the read timeout just before ``getresponse()``;
      with :class:`_AttemptTimeout` that is the time left of the attempt, so the
      deadline is now + timeout and every read of the response waits at most for
      what is left of it (see :class:`_DeadlineSocketIO`).
    * ``_reused`` is False on a connection opened for this request and True once it
      has carried a response: a failure before any response byte on a reused
      connection is most likely a keep-alive connection the server closed while it
      sat in the pool (the exception is marked with ``eas_reused_connection``).
    """

    _deadline = math.inf
    _reused = False
    _idle_since = math.inf  # set when returned to the pool (see _IdleExpiryPool)

    def connect(self) -> None:
        self._reused = False
        super().connect()  # type: ignore[misc]

    def getresponse(self) -> Any:
        timeout = self.timeout  # type: ignore[attr-defined]
        self._deadline = time.monotonic() + timeout if isinstance(timeout, (int, float)) else math.inf
        try:
            response = super().getresponse()  # type: ignore[misc]
        except OSError as exc:
            if self._reused:
                exc.eas_reused_connection = True  # type: ignore[attr-defined]
            raise
        self._reused = True
        return response

    # http.client builds the response with ``self.response_class(sock, method=...)``.
    def response_class(
        self, sock: Any, debuglevel: int = 0, method: str | None = None, url: str | None = None
    ) -> _DeadlineResponse:
        return _DeadlineResponse(sock, self._deadline, debuglevel, method, url)


class _HTTPConnection(_AttemptConnection, urllib3.connection.HTTPConnection):
    pass


class _HTTPSConnection(_AttemptConnection, urllib3.connection.HTTPSConnection):
    pass


class _IdleExpiryPool:
    """Pool mixin: a connection idle in the pool longer than ``keepalive_expiry`` is not reused (C7).

    Servers close idle keep-alive connections (uvicorn after 5 s, aiohttp after 75 s);
    reusing one that the server is closing right now fails the request. Dropping
    ours first (default 10 s) avoids most of those races; the rest are re-sent
    once (see ``PredictCall.on_failure``).
    """

    def __init__(self, *args: Any, keepalive_expiry: float = DEFAULT_KEEPALIVE_EXPIRY, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.keepalive_expiry = keepalive_expiry

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        if conn.sock is not None and time.monotonic() - conn._idle_since > self.keepalive_expiry:
            conn.close()  # urllib3 opens it again, as it does for a dropped one
        return conn

    def _put_conn(self, conn: Any) -> None:
        if conn is not None:
            conn._idle_since = time.monotonic()
        super()._put_conn(conn)  # type: ignore[misc]


class _HTTPConnectionPool(_IdleExpiryPool, urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSConnectionPool(_IdleExpiryPool, urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


class _AttemptTimeout(urllib3.Timeout):
    """urllib3 timeout of one attempt: connect, send and read share one deadline.

    ``urllib3.Timeout(total=t)`` starts its clock only after the wait for a pooled
    connection and bounds each socket read on its own; here both the connect and
    the read timeout are the time left until ``deadline`` (a ``time.monotonic()``
    value) when urllib3 asks, and the response reader enforces the rest.
    """

    def __init__(self, deadline: float) -> None:  # no super().__init__(): nothing to validate
        self.deadline = deadline
        self._connect = self._read = self.total = None
        self._start_connect: float | None = None

    def clone(self) -> _AttemptTimeout:
        return self  # one attempt's object, never shared: its deadline is all the state there is

    def start_connect(self) -> float:
        self._start_connect = now = time.monotonic()
        return now

    @property
    def connect_timeout(self) -> float:  # type: ignore[override]
        return max(self.deadline - time.monotonic(), 0.001)

    @property
    def read_timeout(self) -> float:  # type: ignore[override]
        return max(self.deadline - time.monotonic(), 0.0)  # 0: urllib3 raises ReadTimeoutError

    def __repr__(self) -> str:
        return f"_AttemptTimeout(left={self.deadline - time.monotonic():.3f}s)"


def _pool_classes(keepalive_expiry: float) -> dict[str, Any]:
    return {
        "http": functools.partial(_HTTPConnectionPool, keepalive_expiry=keepalive_expiry),
        "https": functools.partial(_HTTPSConnectionPool, keepalive_expiry=keepalive_expiry),
    }


# Whether the connection of the attempt running in this task had carried a request
# before (a pooled keep-alive connection): set by _TrackingConnector.connect, which
# runs in the task (and so the context) of the predict() call that awaits it.
_REUSED_CONNECTION: contextvars.ContextVar[bool] = contextvars.ContextVar("eas_reused", default=False)


@functools.cache
def _tracking_connector() -> Any:
    """aiohttp.TCPConnector that records whether each connection it hands out is a reused one."""
    import aiohttp

    class _TrackingConnector(aiohttp.TCPConnector):
        async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
            conn = await super().connect(req, traces, timeout)
            proto = conn.protocol
            if proto is not None:
                _REUSED_CONNECTION.set(getattr(proto, "_eas_used", False))
                try:
                    proto._eas_used = True
                except AttributeError:  # a protocol without a __dict__: never "reused", no free re-send
                    pass
            return conn

    return _TrackingConnector


def _on_reused_connection(exc: BaseException) -> bool:
    """Whether a urllib3 error came from a reused connection (see _AttemptConnection)."""
    for cause in (*exc.args[1:2], exc.__cause__, exc.__context__):
        if getattr(cause, "eas_reused_connection", False):
            return True
    return False


# What ``retries=False, redirect=False`` becomes inside urllib3, built once: urllib3
# raises the original exception and never follows a redirect; our core decides.
_NO_RETRIES = urllib3.Retry(False, redirect=False)


def request_body(req: object) -> bytes:
    """The body of ``req``: ``req.to_string()`` (str is UTF-8 encoded), or raw bytes/str."""
    data = req.to_string() if hasattr(req, "to_string") else req  # type: ignore[attr-defined]
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"request must provide to_string() -> bytes|str, got {type(data).__name__}")


def _parse(req: object, body: bytes) -> Any:
    parse = getattr(req, "parse_response", None)
    return parse(body) if parse is not None else body


def urllib3_failure_kind(exc: BaseException) -> FailureKind:
    """Classify a urllib3 exception raised with ``retries=False`` (reusable by other clients)."""
    if isinstance(exc, u3.NewConnectionError):  # subclasses ConnectTimeoutError in urllib3 2
        return FailureKind.CONNECT
    if isinstance(exc, (u3.TimeoutError, u3.EmptyPoolError)):
        return FailureKind.TIMEOUT
    if isinstance(exc, u3.ProtocolError):
        cause = exc.args[1] if len(exc.args) > 1 else None
        if isinstance(cause, TimeoutError):
            return FailureKind.TIMEOUT  # a send that timed out
        if isinstance(cause, (ConnectionError, OSError)) and not isinstance(cause, u3.HTTPError):
            return FailureKind.DISCONNECTED  # RemoteDisconnected, reset, broken pipe
        return FailureKind.BROKEN
    if isinstance(exc, (u3.LocationValueError, u3.ProxySchemeUnknown, u3.SSLError)):
        return FailureKind.FATAL
    if isinstance(exc, u3.HTTPError):
        return FailureKind.BROKEN
    if isinstance(exc, OSError):
        return FailureKind.CONNECT
    return FailureKind.FATAL


def aiohttp_failure_kind(exc: BaseException) -> FailureKind:
    """Classify an aiohttp exception (reusable by other clients)."""
    import aiohttp

    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return FailureKind.TIMEOUT
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return FailureKind.FATAL
    if isinstance(exc, aiohttp.ClientConnectorError):
        return FailureKind.CONNECT
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
        return FailureKind.DISCONNECTED
    if isinstance(exc, aiohttp.InvalidURL):
        return FailureKind.FATAL
    if isinstance(exc, aiohttp.ClientError):
        return FailureKind.BROKEN
    return FailureKind.FATAL


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _NotCarriedOver:
    """An eas-prediction client attribute with no counterpart here: reading or assigning it raises."""

    def __init__(self, hint: str) -> None:
        self.hint = hint
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def _error(self, owner: type) -> AttributeError:
        what = f"{owner.__name__}.{self.name}"
        return AttributeError(f"{what} is not carried over from eas-prediction: {self.hint}")

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        raise self._error(type(obj))

    def __set__(self, obj: Any, value: Any) -> None:
        raise self._error(type(obj))


class _ClientBase:
    """Settings, setters and per-call planning shared by both clients."""

    def __init__(
        self,
        endpoint: str = "",
        service_name: str = "",
        custom_url: str = "",
        *,
        token: str = "",
        endpoint_type: str = ENDPOINT_TYPE_DEFAULT,
        retry_count: int | None = None,
        max_connection_count: int = DEFAULT_MAX_CONNECTIONS,
        timeout: float = DEFAULT_TIMEOUT_MS,
        content_type: str = "",
        headers: Mapping[str, str] | None = None,
        retry_policy: RetryPolicy | None = None,
        retry_budget: RetryBudget | None = None,
        discovery_interval: float = DISCOVERY_INTERVAL,
        discovery_timeout: float = DISCOVERY_TIMEOUT,
        first_discovery_wait: float = FIRST_DISCOVERY_WAIT,
        keepalive_expiry: float = DEFAULT_KEEPALIVE_EXPIRY,
        ca_certs: str | None = None,
    ) -> None:
        self._endpoint = endpoint
        self._service_name = service_name
        self._custom_url = custom_url
        self._token = token
        self._endpoint_type = endpoint_type or ENDPOINT_TYPE_DEFAULT
        policy = retry_policy or RetryPolicy()
        if retry_count is not None:
            policy = _replace_retries(policy, int(retry_count))
        self._retry_policy = policy
        self._max_connection_count = max_connection_count
        self._timeout_ms = float(timeout)
        self._content_type = content_type
        self._extra_headers: dict[str, str] = dict(headers or {})
        self._budget = retry_budget if retry_budget is not None else RetryBudget(now=time.monotonic())
        self._discovery_interval = discovery_interval
        self._discovery_timeout = discovery_timeout
        self._first_discovery_wait = first_discovery_wait
        self._keepalive_expiry = keepalive_expiry
        # https is always verified; ca_certs names a PEM bundle to trust instead of the system's.
        self._ca_certs = ca_certs
        self._cached: ClientConfig | None = None
        self._rng = random.Random()
        self._endpoints: EndpointSet | None = None
        self._url: str | None = None
        self._warnings = WarningLimiter()

    # -- setters of the original API ---------------------------------------------
    def _changed(self) -> None:
        self._cached = None

    def set_endpoint(self, endpoint: str) -> None:
        """Gateway address, or the discovery address in direct mode (needs ``init()``)."""
        self._endpoint = endpoint
        self._changed()

    def set_service_name(self, service_name: str) -> None:
        """Service name; may contain '/' for a sub-path (needs ``init()``)."""
        self._service_name = service_name
        self._changed()

    def set_endpoint_type(self, endpoint_type: str) -> None:
        """ENDPOINT_TYPE_GATEWAY/DEFAULT or ENDPOINT_TYPE_DIRECT (needs ``init()``)."""
        self._endpoint_type = endpoint_type or ENDPOINT_TYPE_DEFAULT
        self._changed()

    def set_token(self, token: str) -> None:
        """Service token; ``''`` sends no Authorization header. Applies to the next call."""
        self._token = token or ""
        self._changed()

    def set_retry_count(self, max_retry_count: int) -> None:
        """Retries after the first attempt (``0``: exactly one attempt; default 5)."""
        self._retry_policy = _replace_retries(self._retry_policy, int(max_retry_count))
        self._changed()

    def set_max_connection_count(self, max_connection_count: int) -> None:
        """Pool size per endpoint (default 100); takes effect at ``init()``."""
        self._max_connection_count = int(max_connection_count)
        self._changed()

    def set_timeout(self, timeout: float) -> None:
        """Per-attempt timeout in **milliseconds** (default 5000)."""
        self._timeout_ms = float(timeout)
        self._changed()

    def set_content_type(self, content_type: str) -> None:
        self._content_type = content_type or ""
        self._changed()

    def set_log_level(self, log_level: int | str) -> None:
        """Level of the ``eas_sdk.predict`` logger (no handler is ever added)."""
        logger.setLevel(log_level)

    def add_extra_headers(self, headers: dict[str, str]) -> None:
        """Headers sent with every request (merged into the previous extra headers)."""
        if not isinstance(headers, dict):
            raise TypeError("headers must be a dict")
        self._extra_headers.update({str(k): str(v) for k, v in headers.items()})
        self._changed()

    # -- read-only views --------------------------------------------------------------
    @property
    def config(self) -> ClientConfig:
        cfg = self._cached
        if cfg is None:
            cfg = ClientConfig(
                endpoint=self._endpoint,
                service_name=self._service_name,
                custom_url=self._custom_url,
                endpoint_type=self._endpoint_type,
                token=self._token,
                timeout=self._timeout_ms / 1000.0,
                content_type=self._content_type,
                headers=tuple(self._extra_headers.items()),
                retry=self._retry_policy,
                max_connection_count=self._max_connection_count,
            )
            self._cached = cfg
        return cfg

    # -- the original's public attributes -------------------------------------------
    # eas-prediction kept its settings in plain attributes that programs assign
    # (``client.timeout = 3000`` before ``init()``). Each one here routes to its
    # setter, so an assignment takes effect exactly like the setter call; the
    # attributes with no counterpart raise instead of being silently ignored.
    @property
    def retry_count(self) -> int:
        """Retries after the first attempt (``set_retry_count``)."""
        return self._retry_policy.retries

    @retry_count.setter
    def retry_count(self, value: int) -> None:
        self.set_retry_count(value)

    @property
    def timeout(self) -> float:
        """Per-attempt timeout in milliseconds (``set_timeout``)."""
        return self._timeout_ms

    @timeout.setter
    def timeout(self, value: float) -> None:
        self.set_timeout(value)

    @property
    def max_connection_count(self) -> int:
        """Connections per endpoint (``set_max_connection_count``; needs ``init()``)."""
        return self._max_connection_count

    @max_connection_count.setter
    def max_connection_count(self, value: int) -> None:
        self.set_max_connection_count(value)

    @property
    def token(self) -> str:
        """The service token (``set_token``); never shown by ``repr()``."""
        return self._token

    @token.setter
    def token(self, value: str) -> None:
        self.set_token(value)

    @property
    def endpoint_name(self) -> str:
        """The gateway (or discovery) address (``set_endpoint``; needs ``init()``)."""
        return self._endpoint

    @endpoint_name.setter
    def endpoint_name(self, value: str) -> None:
        self.set_endpoint(value)

    @property
    def service_name(self) -> str:
        return self._service_name

    @service_name.setter
    def service_name(self, value: str) -> None:
        self.set_service_name(value)

    @property
    def endpoint_type(self) -> str:
        return self._endpoint_type

    @endpoint_type.setter
    def endpoint_type(self, value: str) -> None:
        self.set_endpoint_type(value)

    @property
    def custom_url(self) -> str:
        return self._custom_url

    @custom_url.setter
    def custom_url(self, value: str) -> None:
        self._custom_url = value or ""
        self._changed()

    @property
    def content_type(self) -> str:
        return self._content_type

    @content_type.setter
    def content_type(self, value: str) -> None:
        self.set_content_type(value)

    @property
    def headers(self) -> Mapping[str, str]:
        """The extra headers (read-only view; assign a dict or use ``add_extra_headers``)."""
        return MappingProxyType(self._extra_headers)

    @headers.setter
    def headers(self, value: Mapping[str, str]) -> None:
        self._extra_headers = {}
        self.add_extra_headers(dict(value))

    @property
    def logger(self) -> logging.Logger:
        """The ``eas_sdk.predict`` logger, shared by all clients (no per-client logger)."""
        return logger

    @logger.setter
    def logger(self, value: Any) -> None:
        raise AttributeError(
            f"{type(self).__name__}.logger cannot be replaced: every client logs to "
            "logging.getLogger('eas_sdk.predict'); configure that logger or call set_log_level()"
        )

    endpoint = _NotCarriedOver(
        "use endpoint_name (or set_endpoint()) for the address; the direct-mode set is .endpoints"
    )
    connection_pool = _NotCarriedOver("the pool is internal; set max_connection_count before init()")
    stop = _NotCarriedOver("call close() (or destroy()) to stop the client")

    @property
    def endpoints(self) -> EndpointSet | None:
        """The direct-mode endpoint set (None in gateway mode or before ``init()``)."""
        return self._endpoints

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(endpoint={self._endpoint!r}, service_name={self._service_name!r}, "
            f"custom_url={redact_url(self._custom_url)!r}, endpoint_type={self._endpoint_type!r}, "
            f"token={mask_token(self._token)}, retry_count={self._retry_policy.retries}, "
            f"timeout_ms={self._timeout_ms:g})"
        )

    __str__ = __repr__

    # -- shared plumbing ------------------------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext | bool:
        """For aiohttp: a verifying context with ``ca_certs``, else default verification."""
        if self._ca_certs is None:
            return True
        return ssl.create_default_context(cafile=self._ca_certs)

    def _prepare(self) -> ClientConfig:
        """Validate settings and set up the target (fixed URL or endpoint set)."""
        cfg = self.config
        cfg.validate()
        if cfg.token and cfg.custom_url and _plain_http_to_remote(cfg.custom_url):
            logger.warning("the raw token is sent over plain HTTP to a non-loopback host; prefer https")
        if cfg.direct:
            self._url = None
            self._endpoints = EndpointSet()
        else:
            self._url = cfg.gateway_url()
            self._endpoints = None
        return cfg

    def _new_call(self, body: bytes) -> PredictCall:
        return PredictCall(
            self.config,
            body,
            now=time.monotonic(),
            url=self._url,
            endpoints=self._endpoints,
            budget=self._budget,
            rng=self._rng,
        )

    def _discovery_url(self) -> str:
        return discovery_url(self._endpoint, self._service_name)

    def _discovery_result(self, status: int | None, body: bytes, error: str | None) -> None:
        """Record one discovery outcome (status/body, or an error text)."""
        assert self._endpoints is not None
        try:
            if error is not None:
                raise DiscoveryError(error)
            assert status is not None
            if apply_discovery_response(self._endpoints, status, body):
                logger.info(
                    "service %s endpoints now: %s",
                    self._service_name,
                    ", ".join(f"{e.address}(w={e.weight})" for e in self._endpoints.endpoints),
                )
        except DiscoveryError as exc:
            kept = len(self._endpoints.endpoints)
            if self._warnings.allow(time.monotonic()):
                logger.warning(
                    "service discovery for %s failed (%s); keeping %d known endpoints",
                    self._service_name,
                    exc,
                    kept,
                )
            else:
                logger.debug("service discovery failed again: %s", exc)

    @staticmethod
    def _log_step(attempt: Attempt, step: Step, what: str) -> None:
        if step.body is None and step.error is None and logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "attempt %d to %s failed (%s); retrying in %.3fs",
                attempt.number,
                redact_url(attempt.url),
                what,
                step.delay,
            )


def _plain_http_to_remote(url: str) -> bool:
    import ipaddress
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme != "http":
        return False
    host = parts.hostname or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def _fixed_route(pool: urllib3.PoolManager, url: str) -> tuple[urllib3.HTTPConnectionPool, str] | None:
    """The connection pool and request path PoolManager.urlopen would pick for ``url``.

    None when the URL does not parse or has no scheme: those calls keep going through
    the manager, so they fail (or warn) at predict time exactly as before.
    """
    try:
        u = urllib3.util.parse_url(url)
        if u.scheme is None or u.host is None:
            return None
        return pool.connection_from_host(u.host, port=u.port, scheme=u.scheme), u.request_uri
    except Exception:
        return None


def _replace_retries(policy: RetryPolicy, retries: int) -> RetryPolicy:
    from dataclasses import replace

    return replace(policy, retries=retries)


def _no_endpoint(service: str, waited: float) -> NoEndpointError:
    return NoEndpointError(f"Get service backend timeout: no endpoint list for {service!r} after {waited:g}s")


def _sync_discovery_loop(
    ref: weakref.ReferenceType[PredictClient], url: str, stop: threading.Event, ready: threading.Event
) -> None:
    """Refresh the endpoint list until ``stop`` is set or the client is gone."""
    client = ref()
    if client is None:
        return
    interval, timeout = client._discovery_interval, client._discovery_timeout
    ca_certs = client._ca_certs
    del client
    http = urllib3.PoolManager(num_pools=1, maxsize=1, retries=False, ca_certs=ca_certs)
    http.pool_classes_by_scheme = _pool_classes(DEFAULT_KEEPALIVE_EXPIRY)
    try:
        while not stop.is_set():
            status: int | None = None
            data, error = b"", None
            try:
                # A hanging or trickling discovery server costs at most `timeout` per round.
                deadline = _AttemptTimeout(time.monotonic() + timeout)
                resp = http.request("GET", url, timeout=deadline, retries=False, redirect=False)
                status, data = resp.status, resp.data
            except Exception as exc:  # any failure keeps the last list
                error = _reason(exc)
            client = ref()
            if client is None or stop.is_set():
                return
            client._discovery_result(status, data, error)
            if client._endpoints is not None and client._endpoints.ready:
                ready.set()
            del client
            stop.wait(interval)
    finally:
        http.clear()


async def _async_discovery_loop(
    ref: weakref.ReferenceType[AsyncPredictClient], url: str, ready: asyncio.Event
) -> None:
    """Refresh the endpoint list until cancelled or the client is gone."""
    import aiohttp

    client = ref()
    if client is None:
        return
    interval = client._discovery_interval
    timeout = aiohttp.ClientTimeout(total=client._discovery_timeout)
    connector = aiohttp.TCPConnector(limit=1, ssl=client._ssl_context())
    del client
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        while True:
            status: int | None = None
            data, error = b"", None
            try:
                async with http.get(url, allow_redirects=False) as resp:
                    data = await resp.read()
                    status = resp.status
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure keeps the last list
                error = _reason(exc)
            client = ref()
            if client is None:
                return
            client._discovery_result(status, data, error)
            if client._endpoints is not None and client._endpoints.ready:
                ready.set()
            del client
            await asyncio.sleep(interval)


class PredictClient(_ClientBase):
    """Synchronous, thread-safe client (urllib3 connection pool).

    ``PredictClient(endpoint='', service_name='', custom_url='', *, token='',
    endpoint_type='DEFAULT', retry_count=5, max_connection_count=100,
    timeout=5000 (ms, per attempt), content_type='', headers=None, ca_certs=None)``.
    Advanced: ``retry_policy=RetryPolicy(...)``, ``retry_budget=RetryBudget(...)``. Call ``init()``
    after the setters (``predict()`` does it on first use), ``close()`` at the end,
    or use it as a context manager.

    Note: ``retry_count`` counts *retries* (``1 + retry_count`` attempts; ``0`` means
    one attempt), where eas-prediction 0.36 counted total attempts. Token, timeout,
    retries, content type and extra headers apply to the next call; endpoint,
    service name, endpoint type and pool size need ``init()`` again.
    """

    def __init__(self, endpoint: str = "", service_name: str = "", custom_url: str = "", **kwargs: Any):
        super().__init__(endpoint, service_name, custom_url, **kwargs)
        self._pool: urllib3.PoolManager | None = None
        # Fixed-URL modes: (the URL's connection pool, its request path), looked up once
        # at init() instead of parsing the URL and keying the manager on every attempt.
        self._route: tuple[urllib3.HTTPConnectionPool, str] | None = None
        self._lock = threading.RLock()
        self._stop: threading.Event | None = None
        self._ready: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def init(self) -> None:
        """Apply the settings: create the pool and, in direct mode, start discovery."""
        with self._lock:
            self._shutdown()
            cfg = self._prepare()
            self._pool = urllib3.PoolManager(
                num_pools=64,
                maxsize=cfg.max_connection_count,  # per endpoint, as the async client's limit_per_host
                block=True,  # C11: never more sockets than the pool size
                retries=False,
                ca_certs=self._ca_certs,
            )
            self._pool.pool_classes_by_scheme = _pool_classes(self._keepalive_expiry)
            if self._url is not None:
                self._route = _fixed_route(self._pool, self._url)
            if cfg.direct:
                self._stop = threading.Event()
                self._ready = threading.Event()
                self._thread = threading.Thread(
                    target=_sync_discovery_loop,
                    # A weak reference: an abandoned client is collected and its thread ends.
                    args=(weakref.ref(self), self._discovery_url(), self._stop, self._ready),
                    name=f"eas-discovery-{self._service_name}",
                    daemon=True,
                )
                weakref.finalize(self, self._stop.set)
                self._thread.start()

    def _shutdown(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._discovery_timeout + 0.5)
        self._thread = self._stop = None
        self._route = None
        if self._pool is not None:
            self._pool.clear()
            self._pool = None

    def predict(self, request: Any) -> Any:
        """Send ``request`` (anything with ``to_string()``/``parse_response()``, or raw bytes/str).

        Returns ``request.parse_response(body)`` (the raw body for bytes/str input).
        Raises a :class:`PredictException` subclass from ``eas_sdk.errors``.
        """
        pool = self._pool
        if pool is None:
            with self._lock:  # one lazy init even when many threads start at once
                if self._pool is None:
                    self.init()
                pool = self._pool
        assert pool is not None
        body = request_body(request)
        endpoints = self._endpoints
        if endpoints is not None and not endpoints.ready:
            ready = self._ready
            if ready is None or not ready.wait(self._first_discovery_wait):
                raise _no_endpoint(self._service_name, self._first_discovery_wait)
        route = self._route
        call = PredictCall(
            self.config,
            body,
            now=time.monotonic(),
            url=self._url,
            endpoints=endpoints,
            budget=self._budget,
            rng=self._rng,
        )
        while True:
            now = time.monotonic()
            attempt = call.next_attempt(now)
            # One deadline for the whole attempt: pool wait, connect, send and every
            # read of the response (urllib3's own timeouts bound each step alone).
            timeout = _AttemptTimeout(now + attempt.timeout)
            try:
                if route is not None:
                    # The same as pool.request(), minus re-parsing the URL, the manager's
                    # pool lookup and urllib3's copy of the headers into an HTTPHeaderDict.
                    resp = route[0].urlopen(
                        "POST",
                        route[1],
                        body=attempt.body,
                        headers=attempt.headers,
                        retries=_NO_RETRIES,
                        redirect=False,
                        assert_same_host=False,
                        timeout=timeout,
                        pool_timeout=attempt.timeout,
                        preload_content=False,
                    )
                else:
                    resp = pool.urlopen(
                        "POST",
                        attempt.url,
                        body=attempt.body,
                        headers=attempt.headers,
                        retries=_NO_RETRIES,
                        redirect=False,
                        timeout=timeout,
                        pool_timeout=attempt.timeout,
                        preload_content=False,
                    )
            except Exception as exc:
                if route is not None and isinstance(exc, u3.ClosedPoolError):
                    # close()/init() ran meanwhile (nothing was sent): go through the
                    # manager from now on, which opens a pool again as before.
                    route = None
                    continue
                step = call.on_failure(
                    urllib3_failure_kind(exc),
                    _reason(exc),
                    time.monotonic(),
                    reused=_on_reused_connection(exc),
                )
                self._log_step(attempt, step, type(exc).__name__)
            else:
                try:
                    data = resp.data  # the body, read within the attempt's deadline
                except Exception as exc:  # the response had started: final (D4)
                    step = call.on_failure(
                        urllib3_failure_kind(exc), _reason(exc), time.monotonic(), started=True
                    )
                else:
                    step = call.on_response(resp.status, resp.headers, data, time.monotonic(), time.time())
                    if step.body is not None:
                        return _parse(request, step.body)
                    self._log_step(attempt, step, f"HTTP {resp.status}")
            if step.error is not None:
                raise step.error
            if step.delay > 0:
                time.sleep(step.delay)

    def close(self) -> None:
        """Stop discovery and close pooled connections. ``init()`` may be called again."""
        with self._lock:
            self._shutdown()

    def destroy(self) -> None:
        """Alias of :meth:`close` (the original only stopped the refresh thread)."""
        self.close()

    def __enter__(self) -> PredictClient:
        if self._pool is None:
            self.init()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncPredictClient(_ClientBase):
    """Asyncio client (aiohttp) with the same settings; ``init``/``predict``/``close`` are coroutines.

    ``async with AsyncPredictClient(endpoint, service, token=...) as client:
    resp = await client.predict(req)``.
    """

    def __init__(self, endpoint: str = "", service_name: str = "", custom_url: str = "", **kwargs: Any):
        super().__init__(endpoint, service_name, custom_url, **kwargs)
        self._session: Any = None  # aiohttp.ClientSession
        self._init_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._ready_event: asyncio.Event | None = None

    async def init(self) -> None:
        """Apply the settings: create the session and, in direct mode, start discovery."""
        import aiohttp

        await self._shutdown()
        cfg = self._prepare()
        connector = _tracking_connector()(
            # max_connection_count per endpoint (as the sync client's pool per host), no
            # total cap: in direct mode every worker gets its own N connections.
            limit=0,
            limit_per_host=cfg.max_connection_count,
            keepalive_timeout=self._keepalive_expiry,
            ssl=self._ssl_context(),
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers={"Accept-Encoding": "identity"},
            auto_decompress=False,
            raise_for_status=False,
        )
        if cfg.direct:
            self._ready_event = asyncio.Event()
            self._task = asyncio.create_task(
                _async_discovery_loop(weakref.ref(self), self._discovery_url(), self._ready_event),
                name=f"eas-discovery-{self._service_name}",
            )

    async def _shutdown(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def predict(self, request: Any) -> Any:
        """Send ``request``; see :meth:`PredictClient.predict`."""
        import aiohttp

        if self._session is None:
            async with self._init_lock:  # one lazy init even when many tasks start at once
                if self._session is None:
                    await self.init()
        session = self._session
        body = request_body(request)
        if self._endpoints is not None and not self._endpoints.ready:
            assert self._ready_event is not None
            try:
                await asyncio.wait_for(self._ready_event.wait(), self._first_discovery_wait)
            except asyncio.TimeoutError:
                raise _no_endpoint(self._service_name, self._first_discovery_wait) from None
        call = self._new_call(body)
        while True:
            attempt = call.next_attempt(time.monotonic())
            _REUSED_CONNECTION.set(False)
            started = False
            try:
                # total: pool wait, connect, send and the whole response, as the sync client.
                async with session.post(
                    attempt.url,
                    data=attempt.body,
                    headers=attempt.headers,
                    timeout=aiohttp.ClientTimeout(total=attempt.timeout),
                    allow_redirects=False,
                ) as resp:
                    started = True  # status line and headers are in
                    data = await resp.read()
                    status, headers = resp.status, resp.headers
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                step = call.on_failure(
                    aiohttp_failure_kind(exc),
                    _reason(exc),
                    time.monotonic(),
                    reused=_REUSED_CONNECTION.get(),
                    started=started,
                )
                self._log_step(attempt, step, type(exc).__name__)
            else:
                step = call.on_response(status, headers, data, time.monotonic(), time.time())
                self._log_step(attempt, step, f"HTTP {status}")
            if step.body is not None:
                return _parse(request, step.body)
            if step.error is not None:
                raise step.error
            if step.delay > 0:
                await asyncio.sleep(step.delay)

    async def close(self) -> None:
        """Stop discovery and close the session. ``init()`` may be called again."""
        await self._shutdown()

    async def destroy(self) -> None:
        await self.close()

    async def __aenter__(self) -> AsyncPredictClient:
        if self._session is None:
            await self.init()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
