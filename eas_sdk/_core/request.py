"""One predict call as an I/O-free state machine, shared by the sync and async clients.

A driver (``eas_sdk.predict``) loops::

    call = PredictCall(config, body, now=monotonic(), target=..., budget=...)
    while True:
        attempt = call.next_attempt(monotonic())      # URL, fresh headers, timeout
        try:
            status, headers, data = send(attempt)      # the only I/O
        except <transport error> as exc:
            step = call.on_failure(kind_of(exc), str(exc), monotonic())
        else:
            step = call.on_response(status, headers, data, monotonic())
        if step.body is not None: return step.body
        if step.error is not None: raise step.error
        sleep(step.delay)

Headers are rebuilt for every attempt from the immutable :class:`ClientConfig`, so
nothing leaks from one call (or attempt) into the next: a new ``Date``,
``Content-MD5`` and signature each time, and after ``set_token('')`` no
``Authorization`` at all. ``X-Request-Id`` stays the same across the retries of one
call (servers may use it to de-duplicate) and ``X-Eas-Deadline-Ms`` carries the
time this attempt will be waited for: the per-attempt timeout, or less once the
overall deadline is nearer, so it shrinks towards the end of a call.
"""

from __future__ import annotations

import math
import random
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import (
    ConnectError,
    NoEndpointError,
    PredictException,
    TimeoutError,
    TransportError,
    error_for_status,
)
from .auth import http_date, plain_headers, signed_headers
from .constants import (
    DEFAULT_CONTENT_TYPE,
    ENDPOINT_TYPE_DEFAULT,
    ENDPOINT_TYPE_DIRECT,
    ENDPOINT_TYPE_VIPSERVER,
    HEADER_CONTENT_TYPE,
    HEADER_DEADLINE_MS,
    HEADER_REQUEST_ID,
)
from .endpoints import Endpoint, EndpointSet, normalize_gateway_endpoint, predict_url
from .retry import FailureKind, RetryBudget, RetryDecision, RetryPolicy

DEFAULT_TIMEOUT_MS = 5000
DEFAULT_MAX_CONNECTIONS = 100
SUPPORTED_ENDPOINT_TYPES = ("", ENDPOINT_TYPE_DEFAULT, ENDPOINT_TYPE_DIRECT)

_QUERY_RE = re.compile(r"\?[^\s'\"]*")


def redact_url(url: str) -> str:
    """``url`` without its query string (a custom_url may carry credentials there)."""
    return _QUERY_RE.sub("?<redacted>", url)


def mask_token(token: str) -> str:
    return "***" if token else "''"


@dataclass(frozen=True)
class ClientConfig:
    """Immutable snapshot of a client's settings (the setters build a new one).

    ``timeout`` is the per-attempt timeout in seconds; ``headers`` the extra headers.
    """

    endpoint: str = ""
    service_name: str = ""
    custom_url: str = ""
    endpoint_type: str = ENDPOINT_TYPE_DEFAULT
    token: str = field(default="", repr=False)
    timeout: float = DEFAULT_TIMEOUT_MS / 1000.0
    content_type: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_connection_count: int = DEFAULT_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError("timeout must be > 0")
        if self.max_connection_count < 1:
            raise ValueError("max_connection_count must be >= 1")

    def __repr__(self) -> str:
        return (
            f"ClientConfig(endpoint={self.endpoint!r}, service_name={self.service_name!r}, "
            f"custom_url={redact_url(self.custom_url)!r}, endpoint_type={self.endpoint_type!r}, "
            f"token={mask_token(self.token)}, timeout={self.timeout}, retries={self.retry.retries}, "
            f"max_connection_count={self.max_connection_count})"
        )

    __str__ = __repr__

    @property
    def direct(self) -> bool:
        """Direct (VPC) mode: discovery plus client-side WRR. custom_url wins over it."""
        return self.endpoint_type == ENDPOINT_TYPE_DIRECT and not self.custom_url

    def validate(self) -> None:
        if self.endpoint_type == ENDPOINT_TYPE_VIPSERVER:
            raise PredictException(
                500, "Unsupported endpoint type: VIPSERVER (Alibaba-internal naming service; use DIRECT)"
            )
        if self.endpoint_type not in SUPPORTED_ENDPOINT_TYPES:
            raise PredictException(500, f"Unsupported endpoint type: {self.endpoint_type}")
        if not self.custom_url and not self.service_name:
            raise PredictException(500, "'service_name' must be set (or use custom_url)")

    def gateway_url(self, env: Mapping[str, str] | None = None) -> str:
        """The fixed request URL in gateway and custom_url modes."""
        if self.custom_url:
            return self.custom_url
        return predict_url(
            normalize_gateway_endpoint(self.endpoint, self.service_name, env), self.service_name
        )


def _find(headers: Mapping[str, str], name: str) -> str | None:
    lower = name.lower()
    for key, value in headers.items():
        if key.lower() == lower:
            return value
    return None


def merge_headers(base: Mapping[str, str], override: Mapping[str, str]) -> dict[str, str]:
    """``base`` updated by ``override``, header names compared case-insensitively."""
    names = {k.lower() for k in override}
    merged = {k: v for k, v in base.items() if k.lower() not in names}
    merged.update(override)
    return merged


def effective_content_type(config: ClientConfig) -> str:
    """set_content_type() value, else a Content-Type extra header, else octet-stream."""
    if config.content_type:
        return config.content_type
    return _find(dict(config.headers), HEADER_CONTENT_TYPE) or DEFAULT_CONTENT_TYPE


def build_headers(
    config: ClientConfig,
    body: bytes,
    *,
    request_id: str,
    deadline_ms: int | None = None,
    date: str | None = None,
) -> dict[str, str]:
    """Fresh headers for one attempt.

    * token + gateway/direct mode: EAS HMAC (Content-MD5, Content-Type, Date, Authorization);
    * token + custom_url: the raw token (Content-Type, Date, Authorization);
    * no token: Content-Type only, and no Authorization unless an extra header has one.
    Content-Length is left to the transport.
    """
    ctype = effective_content_type(config)
    extra = dict(config.headers)
    ours: dict[str, str]
    if config.token:
        when = date if date is not None else http_date()
        if config.custom_url:
            ours = plain_headers(config.token, ctype, when)
        else:
            ours = signed_headers(config.token, body, config.service_name, ctype, when)
    else:
        ours = {HEADER_CONTENT_TYPE: ctype}
    if _find(extra, HEADER_REQUEST_ID) is None:
        ours[HEADER_REQUEST_ID] = request_id
    if deadline_ms is not None:
        ours[HEADER_DEADLINE_MS] = str(max(1, deadline_ms))
    return merge_headers(extra, ours)


def new_request_id() -> str:
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Attempt:
    """Everything a transport needs to send one attempt."""

    url: str
    headers: dict[str, str]
    body: bytes
    timeout: float
    endpoint: Endpoint | None = None
    number: int = 1  # 1-based


@dataclass(frozen=True)
class Step:
    """What the driver does next: return ``body``, raise ``error`` or sleep ``delay``."""

    body: bytes | None = None
    error: PredictException | None = None
    delay: float = 0.0


def _sanitize(reason: str) -> str:
    reason = redact_url(reason)
    return reason if len(reason) <= 300 else reason[:300] + "..."


class PredictCall:
    """State of one predict call across its attempts (see the module docstring)."""

    def __init__(
        self,
        config: ClientConfig,
        body: bytes,
        *,
        now: float,
        url: str | None = None,
        endpoints: EndpointSet | None = None,
        budget: RetryBudget | None = None,
        rng: random.Random | None = None,
        request_id: str | None = None,
    ) -> None:
        if url is None and endpoints is None:
            raise ValueError("need a fixed url or an endpoint set")
        self.config = config
        self.policy = config.retry
        self.body = body
        self.url = url
        self.endpoints = endpoints
        self.budget = budget
        self.rng = rng
        self.request_id = request_id or new_request_id()
        self.started = now
        self.deadline = now + self.policy.total_timeout(config.timeout)
        self.attempts = 0  # attempts sent
        self.retries = 0  # retries spent (attempts that counted against the policy)
        self.stale_left = self.policy.stale_connection_retries
        self.tried: list[Endpoint] = []
        self.last_target = ""
        if budget is not None:
            budget.on_call()

    def remaining(self, now: float) -> float:
        return self.deadline - now

    def next_attempt(self, now: float) -> Attempt:
        remaining = self.remaining(now)
        if remaining <= 0:
            total = self.policy.total_timeout(self.config.timeout)
            raise TimeoutError(
                f"url: {redact_url(self.last_target)}, error: deadline of "
                f"{total:.3f}s exceeded after {self.attempts} attempts"
            )
        endpoint: Endpoint | None = None
        if self.url is not None:
            url = self.url
        else:
            assert self.endpoints is not None
            endpoint = self.endpoints.pick(self.tried)  # raises NoEndpointError
            url = predict_url(endpoint.base_url, self.config.service_name)
            self.tried.append(endpoint)
        self.attempts += 1
        self.last_target = url
        timeout = min(self.config.timeout, remaining)
        # The server learns how long this attempt will be waited for (like Envoy's
        # x-envoy-expected-rq-timeout-ms with a per-try timeout): work still queued
        # after that is wasted. Near the overall deadline the value shrinks with it.
        headers = build_headers(
            self.config, self.body, request_id=self.request_id, deadline_ms=math.ceil(timeout * 1000)
        )
        return Attempt(url, headers, self.body, timeout, endpoint, self.attempts)

    def _retry(self, decision: RetryDecision, now: float) -> bool:
        if not decision.retry:
            return False
        if self.budget is not None and not self.budget.try_spend(now):
            return False
        self.retries += 1
        return True

    def on_response(
        self, status: int, headers: Mapping[str, str], body: bytes, now: float, now_epoch: float | None = None
    ) -> Step:
        if status == 200:
            return Step(body=body)
        decision = self.policy.after_status(
            status, headers, self.retries, self.remaining(now), self.rng, now_epoch
        )
        if self._retry(decision, now):
            return Step(delay=decision.delay)
        return Step(error=error_for_status(status, body, headers, self.request_id))

    def on_failure(self, kind: FailureKind, reason: str, now: float) -> Step:
        """An attempt ended without an HTTP response."""
        if kind is FailureKind.DISCONNECTED and self.stale_left > 0 and self.remaining(now) > 0:
            # Most likely a pooled keep-alive connection the server had closed: re-send
            # at once; this does not count as a retry (F5).
            self.stale_left -= 1
            if self.endpoints is not None and self.tried:
                self.tried.pop()  # the endpoint itself is not suspect
            return Step(delay=0.0)
        decision = self.policy.after_failure(kind, self.retries, self.remaining(now), self.rng)
        if self._retry(decision, now):
            return Step(delay=decision.delay)
        message = f"url: {redact_url(self.last_target)}, error: {_sanitize(reason)}"
        error: TransportError
        if kind is FailureKind.TIMEOUT:
            error = TimeoutError(message)
        elif kind in (FailureKind.CONNECT, FailureKind.DISCONNECTED):
            error = ConnectError(message)
        else:
            error = TransportError(message)
        return Step(error=error)


__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_TIMEOUT_MS",
    "Attempt",
    "ClientConfig",
    "NoEndpointError",
    "PredictCall",
    "Step",
    "build_headers",
    "effective_content_type",
    "merge_headers",
    "new_request_id",
    "redact_url",
]
