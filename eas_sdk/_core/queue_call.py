"""One queue operation as an I/O-free state machine (the queue twin of ``PredictCall``).

A driver (``eas_sdk.queue`` or ``eas_sdk.aio_queue``) loops::

    call = QueueCall("GET", url, headers, body, timeout=t, policy=..., budget=..., now=monotonic())
    while True:
        try:
            status, headers, data = send(call.method, call.url, call.headers, call.body,
                                         call.attempt_timeout)     # the only I/O
        except <transport failure> as exc:
            step = call.on_failure(exc.kind, exc.reason, monotonic(), reused=..., sent=...)
        else:
            step = call.on_response(status, headers, data, monotonic(), time())
        if step.body is not None: return ...
        if step.error is not None: raise step.error
        sleep(step.delay)

The rules: transport failures, 450/5xx and 429-with-Retry-After are retried with
jittered back-off within the call's deadline and the client's retry budget; a 4xx
never is. A queue call is safe to repeat (a put carries an ``X-Request-Id``, the
server stores it once), so an answer cut off half way is asked for again; the
exception is a ``get`` that deletes what it reads (``idempotent=False``): once it
may have reached the server a retry could lose those records, so only a failed
connect is retried. A reused keep-alive connection found closed before any answer
is re-sent at once, for free (not for a deleting ``get``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import NamedTuple

from ..errors import ConnectError, PredictException, TimeoutError, TransportError, error_for_status
from .request import redact_url
from .retry import FailureKind, RetryBudget, RetryDecision, RetryPolicy

NOT_REPEATABLE = "the request may have reached the server, which may have deleted the records it read"


class QueueStep(NamedTuple):
    """What the driver does next: return the answer, raise ``error`` or sleep ``delay`` and resend."""

    status: int = 0
    headers: Mapping[str, str] | None = None
    body: bytes | None = None
    error: PredictException | None = None
    delay: float = 0.0


def status_error(
    status: int,
    body: bytes,
    headers: Mapping[str, str],
    request_id: str | None = None,
    attempts: int | None = None,
) -> PredictException:
    return error_for_status(status, body, dict(headers), request_id, attempts)


class QueueCall:
    """State of one queue call across its attempts (see the module docstring)."""

    __slots__ = (
        "attempt_timeout",
        "attempts",
        "body",
        "budget",
        "deadline",
        "headers",
        "idempotent",
        "method",
        "policy",
        "retries",
        "rng",
        "stale_left",
        "url",
    )

    def __init__(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        *,
        timeout: float,
        now: float,
        policy: RetryPolicy,
        budget: RetryBudget,
        rng: random.Random | None = None,
        read_timeout: float | None = None,
        idempotent: bool = True,
    ) -> None:
        """``timeout``: the client's per-attempt timeout (s); ``read_timeout``: a long-poll's wait."""
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.policy = policy
        self.budget = budget
        self.rng = rng
        self.idempotent = idempotent
        # A long-polling get waits for the server's timeout plus a second.
        self.attempt_timeout = max(timeout, read_timeout or 0.0)
        self.deadline = now + max(policy.total_timeout(timeout), self.attempt_timeout + timeout)
        self.retries = 0
        self.attempts = 0  # attempts that ended, free re-sends included
        self.stale_left = policy.stale_connection_retries
        budget.on_call()

    def _retry(self, decision: RetryDecision, now: float) -> bool:
        if decision.retry and self.budget.try_spend(now):
            self.retries += 1
            return True
        return False

    def on_response(
        self, status: int, headers: Mapping[str, str], body: bytes, now: float, now_epoch: float | None = None
    ) -> QueueStep:
        self.attempts += 1
        if 200 <= status < 300:
            return QueueStep(status, headers, body)
        decision = self.policy.after_status(
            status, headers, self.retries, self.deadline - now, self.rng, now_epoch
        )
        if self._retry(decision, now):
            return QueueStep(delay=decision.delay)
        return QueueStep(error=status_error(status, body, headers, self._request_id(), self.attempts))

    def on_failure(
        self,
        kind: FailureKind,
        reason: str,
        now: float,
        *,
        reused: bool = False,
        started: bool = False,
        sent: bool = True,
    ) -> QueueStep:
        """An attempt without a complete answer; ``sent``: the request may have reached the server."""
        self.attempts += 1
        if kind is FailureKind.BROKEN:
            kind = FailureKind.DISCONNECTED  # a cut-off or garbled answer: ask again (see above)
        if (
            kind is FailureKind.DISCONNECTED
            and reused
            and not started
            and self.idempotent
            and self.stale_left > 0
        ):
            self.stale_left -= 1  # an idle connection the server had closed: resend at once, free
            return QueueStep()
        cls: type[TransportError]
        if kind is FailureKind.TIMEOUT:
            cls = TimeoutError
        elif kind is FailureKind.FATAL:
            cls = TransportError
        else:
            cls = ConnectError
        # The same message, type and code (500, no status) as a predict call's failure.
        text = f"url: {redact_url(self.url)}, error: {reason}"
        if sent and not self.idempotent and kind is not FailureKind.FATAL:
            text += f" (not retried: {NOT_REPEATABLE})"
            return QueueStep(error=cls(text, request_id=self._request_id(), attempts=self.attempts))
        decision = self.policy.after_failure(kind, self.retries, self.deadline - now, self.rng)
        if self._retry(decision, now):
            return QueueStep(delay=decision.delay)
        return QueueStep(error=cls(text, request_id=self._request_id(), attempts=self.attempts))

    def _request_id(self) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == "x-request-id"), None)
