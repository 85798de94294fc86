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
import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from ..errors import (
    ConnectError,
    NoEndpointError,
    PredictException,
    TimeoutError,
    TransportError,
    error_for_status,
)
from .auth import canonical_resource, content_md5, eas_authorization, http_date
from .constants import (
    DEFAULT_CONTENT_TYPE,
    ENDPOINT_TYPE_DEFAULT,
    ENDPOINT_TYPE_DIRECT,
    ENDPOINT_TYPE_VIPSERVER,
    HEADER_AUTHORIZATION,
    HEADER_CONTENT_MD5,
    HEADER_CONTENT_TYPE,
    HEADER_DATE,
    HEADER_DEADLINE_MS,
    HEADER_REQUEST_ID,
)
from .endpoints import Endpoint, EndpointSet, normalize_gateway_endpoint, predict_url
from .retry import NO_RETRY, FailureKind, RetryBudget, RetryDecision, RetryPolicy

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

    @cached_property
    def plan(self) -> HeaderPlan:
        """What every attempt's headers share, worked out once per config (see build_headers)."""
        return HeaderPlan(self)

    @cached_property
    def total_timeout(self) -> float:
        """Overall deadline of one call (``retry.total_timeout(timeout)``)."""
        return self.retry.total_timeout(self.timeout)

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


_MODE_NONE, _MODE_SIGNED, _MODE_PLAIN = 0, 1, 2


class HeaderPlan:
    """The per-config part of :func:`build_headers`, computed once per :class:`ClientConfig`.

    Holds the extra headers already stripped of every name this client sets itself
    (compared case-insensitively, as ``merge_headers`` does), the effective content
    type, the signing key and resource, so an attempt only adds what changes: the
    body's MD5, the date, the signature, the request id and the deadline.
    """

    __slots__ = ("ctype", "extra", "extra_no_deadline", "key", "mode", "own_request_id", "resource", "token")

    def __init__(self, config: ClientConfig) -> None:
        self.ctype = effective_content_type(config)
        self.token = config.token
        self.key = config.token.encode("utf-8")
        self.resource = canonical_resource(config.service_name)
        if not config.token:
            self.mode = _MODE_NONE
            ours = [HEADER_CONTENT_TYPE]
        elif config.custom_url:
            self.mode = _MODE_PLAIN
            ours = [HEADER_CONTENT_TYPE, HEADER_DATE, HEADER_AUTHORIZATION]
        else:
            self.mode = _MODE_SIGNED
            ours = [HEADER_CONTENT_MD5, HEADER_CONTENT_TYPE, HEADER_DATE, HEADER_AUTHORIZATION]
        extra = dict(config.headers)
        self.own_request_id = _find(extra, HEADER_REQUEST_ID) is None
        if self.own_request_id:
            ours.append(HEADER_REQUEST_ID)
        taken = {name.lower() for name in ours}
        self.extra_no_deadline = {k: v for k, v in extra.items() if k.lower() not in taken}
        taken.add(HEADER_DEADLINE_MS.lower())
        self.extra = {k: v for k, v in extra.items() if k.lower() not in taken}


def _headers(
    plan: HeaderPlan, body: bytes, request_id: str, deadline: str | None, date: str | None
) -> dict[str, str]:
    """One attempt's headers as one new dict, in the order of ``merge_headers(extra, ours)``."""
    headers = (plan.extra if deadline is not None else plan.extra_no_deadline).copy()
    mode = plan.mode
    if mode == _MODE_SIGNED:
        md5_hex = content_md5(body)
        when = date if date is not None else http_date()
        headers[HEADER_CONTENT_MD5] = md5_hex
        headers[HEADER_CONTENT_TYPE] = plan.ctype
        headers[HEADER_DATE] = when
        headers[HEADER_AUTHORIZATION] = eas_authorization(plan.key, md5_hex, plan.ctype, when, plan.resource)
    elif mode == _MODE_PLAIN:
        headers[HEADER_CONTENT_TYPE] = plan.ctype
        headers[HEADER_DATE] = date if date is not None else http_date()
        headers[HEADER_AUTHORIZATION] = plan.token
    else:
        headers[HEADER_CONTENT_TYPE] = plan.ctype
    if plan.own_request_id:
        headers[HEADER_REQUEST_ID] = request_id
    if deadline is not None:
        headers[HEADER_DEADLINE_MS] = deadline
    return headers


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
    Extra headers come first, minus those these replace (names compared
    case-insensitively). Content-Length is left to the transport.
    """
    deadline = None if deadline_ms is None else str(max(1, deadline_ms))
    return _headers(config.plan, body, request_id, deadline, date)


def new_request_id() -> str:
    """32 random hex digits (128 bits from the OS: unique across processes and forks)."""
    return os.urandom(16).hex()


# Attempt and Step are immutable named tuples: built once or twice per call, and a
# tuple is cheaper to make than a frozen dataclass.
class Attempt(NamedTuple):
    """Everything a transport needs to send one attempt."""

    url: str
    headers: dict[str, str]
    body: bytes
    timeout: float
    endpoint: Endpoint | None = None
    number: int = 1  # 1-based


class Step(NamedTuple):
    """What the driver does next: return ``body``, raise ``error`` or sleep ``delay``."""

    body: bytes | None = None
    error: PredictException | None = None
    delay: float = 0.0


def _sanitize(reason: str) -> str:
    reason = redact_url(reason)
    return reason if len(reason) <= 300 else reason[:300] + "..."


class PredictCall:
    """State of one predict call across its attempts (see the module docstring)."""

    __slots__ = (
        "attempts",
        "body",
        "budget",
        "config",
        "deadline",
        "endpoints",
        "last_target",
        "policy",
        "request_id",
        "retries",
        "rng",
        "stale_left",
        "started",
        "tried",
        "url",
    )

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
        self.policy = policy = config.retry
        self.body = body
        self.url = url
        self.endpoints = endpoints
        self.budget = budget
        self.rng = rng
        self.request_id = request_id or os.urandom(16).hex()  # new_request_id(), inlined
        self.started = now
        self.deadline = now + config.total_timeout
        self.attempts = 0  # attempts sent
        self.retries = 0  # retries spent (attempts that counted against the policy)
        self.stale_left = policy.stale_connection_retries
        self.tried: list[Endpoint] = []
        self.last_target = ""
        if budget is not None:
            budget.on_call()

    def remaining(self, now: float) -> float:
        return self.deadline - now

    def next_attempt(self, now: float) -> Attempt:
        remaining = self.deadline - now
        config = self.config
        if remaining <= 0:
            raise TimeoutError(
                f"url: {redact_url(self.last_target)}, error: deadline of "
                f"{config.total_timeout:.3f}s exceeded after {self.attempts} attempts",
                request_id=self.request_id,
                attempts=self.attempts,
            )
        endpoint: Endpoint | None = None
        url = self.url
        if url is None:
            assert self.endpoints is not None
            endpoint = self.endpoints.pick(self.tried)  # raises NoEndpointError
            url = predict_url(endpoint.base_url, config.service_name)
            self.tried.append(endpoint)
        self.attempts = number = self.attempts + 1
        self.last_target = url
        timeout = config.timeout
        if remaining < timeout:
            timeout = remaining
        # The server learns how long this attempt will be waited for (like Envoy's
        # x-envoy-expected-rq-timeout-ms with a per-try timeout): work still queued
        # after that is wasted. Near the overall deadline the value shrinks with it.
        deadline = str(max(1, math.ceil(timeout * 1000)))
        headers = _headers(config.plan, self.body, self.request_id, deadline, None)
        return Attempt(url, headers, self.body, timeout, endpoint, number)

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
        return Step(error=error_for_status(status, body, headers, self.request_id, self.attempts))

    def on_failure(
        self, kind: FailureKind, reason: str, now: float, *, reused: bool = False, started: bool = False
    ) -> Step:
        """An attempt ended without a complete HTTP response.

        ``reused``: the attempt went out on a keep-alive connection taken from the pool
        (not one opened for it). ``started``: the status line had arrived and the body
        then failed. Only failures before any response byte are retried; a
        response that started is final, a timeout raising TimeoutError and anything
        else TransportError.
        """
        if started:
            if kind is not FailureKind.TIMEOUT:
                kind = FailureKind.BROKEN
            decision = NO_RETRY
        elif kind is FailureKind.DISCONNECTED and reused and self.stale_left > 0 and self.remaining(now) > 0:
            # A pooled keep-alive connection the server closed while it sat idle (the
            # request raced the close): re-send at once; this is not a retry.
            # Only for a reused connection: one opened for this attempt that drops is
            # an ordinary failure, so retry_count=0 still means one attempt.
            self.stale_left -= 1
            if self.endpoints is not None and self.tried:
                self.tried.pop()  # the endpoint itself is not suspect
            return Step(delay=0.0)
        else:
            decision = self.policy.after_failure(kind, self.retries, self.remaining(now), self.rng)
        if self._retry(decision, now):
            return Step(delay=decision.delay)
        message = f"url: {redact_url(self.last_target)}, error: {_sanitize(reason)}"
        error: TransportError
        if kind is FailureKind.TIMEOUT:
            error = TimeoutError(message, request_id=self.request_id, attempts=self.attempts)
        elif kind in (FailureKind.CONNECT, FailureKind.DISCONNECTED):
            error = ConnectError(message, request_id=self.request_id, attempts=self.attempts)
        else:
            error = TransportError(message, request_id=self.request_id, attempts=self.attempts)
        return Step(error=error)


__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_TIMEOUT_MS",
    "Attempt",
    "ClientConfig",
    "HeaderPlan",
    "NoEndpointError",
    "PredictCall",
    "Step",
    "build_headers",
    "effective_content_type",
    "merge_headers",
    "new_request_id",
    "redact_url",
]
