"""PredictClient (threads) here, AsyncPredictClient (asyncio) in ``eas_sdk.aio_predict``.

Both are thin drivers over the I/O-free core in ``eas_sdk._core``: settings live
in a :class:`~eas_sdk._core.request.ClientConfig`, each call is a
:class:`~eas_sdk._core.request.PredictCall` (URL, fresh signed headers, retry and
deadline decisions), endpoints come from :mod:`eas_sdk._core.endpoints`. The two
clients only hand attempts to a transport (``eas_sdk._transports``), sleep and run
the direct-mode discovery refresh (``eas_sdk._discovery``).

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
  for ever). Nothing is retried once a response has started.
* ``ENDPOINT_TYPE_VIPSERVER`` (an Alibaba-internal naming service reachable only
  inside Alibaba's network) is accepted as a constant but ``init()`` rejects it.
* The library adds no logging handlers; ``set_log_level`` sets the level of the
  ``eas_sdk.predict`` logger (shared by all clients).
* The connection pool blocks when full (``max_connection_count`` connections per
  endpoint, never more, in both clients) instead of opening throw-away extra
  connections; a connection idle for ``keepalive_expiry`` (10 s) is not reused.
"""

from __future__ import annotations

import threading
import time
import weakref
from types import TracebackType
from typing import Any

from ._client_base import _ClientBase, _no_endpoint, _parse, request_body
from ._core.constants import (
    ENDPOINT_TYPE_DEFAULT,
    ENDPOINT_TYPE_DIRECT,
    ENDPOINT_TYPE_GATEWAY,
    ENDPOINT_TYPE_VIPSERVER,
)
from ._core.failures import classify
from ._core.request import PredictCall
from ._discovery import sync_discovery_loop
from ._transports import COALESCE_MAX_BODY, BaseTransport, HTTPTransport, Request, TransportFailure
from .aio_predict import AsyncPredictClient
from .errors import PredictException

__all__ = [
    "COALESCE_MAX_BODY",
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

# The failure classifier under the names this module has always exported: it knows
# urllib3's and aiohttp's exceptions as well as the SDK transports' own.
urllib3_failure_kind = classify
aiohttp_failure_kind = classify


class PredictClient(_ClientBase):
    """Synchronous, thread-safe client (a keep-alive connection pool per endpoint).

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
        self._http: BaseTransport | None = None
        self._lock = threading.RLock()
        self._stop: threading.Event | None = None
        self._ready: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def init(self) -> None:
        """Apply the settings: create the pool and, in direct mode, start discovery."""
        with self._lock:
            self._shutdown()
            cfg = self._prepare()
            self._http = self._sync_transport()
            if cfg.direct:
                self._stop = threading.Event()
                self._ready = threading.Event()
                discovery = self._transport or HTTPTransport(
                    max_connections=1, ca_certs=self._ca_certs, client_cert=self._client_cert
                )
                self._thread = threading.Thread(
                    target=sync_discovery_loop,
                    # A weak reference: an abandoned client is collected and its thread ends.
                    args=(weakref.ref(self), self._discovery_url(), self._stop, self._ready, discovery),
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
        if self._http is not None:
            self._http.close()
            self._http = None

    def predict(self, request: Any) -> Any:
        """Send ``request`` (anything with ``to_string()``/``parse_response()``, or raw bytes/str).

        Returns ``request.parse_response(body)`` (the raw body for bytes/str input).
        Raises a :class:`PredictException` subclass from ``eas_sdk.errors``.
        """
        http = self._http
        if http is None:
            with self._lock:  # one lazy init even when many threads start at once
                if self._http is None:
                    self.init()
                http = self._http
        assert http is not None
        body = request_body(request)
        endpoints = self._endpoints
        if endpoints is not None and not endpoints.ready:
            ready = self._ready
            if ready is None or not ready.wait(self._first_discovery_wait):
                raise _no_endpoint(self._service_name, self._first_discovery_wait)
        call = PredictCall(
            self.config,
            body,
            now=time.monotonic(),
            url=self._url,
            endpoints=endpoints,
            budget=self._budget,
            rng=self._rng,
        )
        send = http.handle_request
        while True:
            attempt = call.next_attempt(time.monotonic())
            attempt.headers.setdefault("Accept-Encoding", "identity")  # never a compressed answer
            try:
                # One timeout for the whole attempt: pool wait, connect, send, full response.
                resp = send(Request("POST", attempt.url, attempt.headers, attempt.body, attempt.timeout))
            except TransportFailure as exc:
                step = self._failed_attempt(call, attempt, exc)
            else:
                step = call.on_response(resp.status, resp.headers, resp.body, time.monotonic(), time.time())
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
        if self._http is None:
            self.init()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
