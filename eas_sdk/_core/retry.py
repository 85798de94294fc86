"""Retry policy of the SDK: which failures are retried, how long to wait, and how many.

I/O-free: nothing here sleeps or reads a clock; callers pass ``now`` (a
``time.monotonic()`` value) and an optional ``random.Random``. The sync and async
predict clients and the queue client all drive the same objects:

* :class:`RetryPolicy` (immutable): ``retries=5`` means **1 + 5 attempts** (the
  reference ``eas-prediction`` client counts total attempts instead). Full-jitter
  exponential back-off: the delay before retry ``n`` (0-based) is uniform in
  ``[0, min(cap, base * 2**n))`` with base 50 ms and cap 2 s.
* Retryable: transport errors before any response byte (connect refused/reset, a
  stale keep-alive connection, an attempt timeout), and the statuses 450, 500
  (EAS parity, switchable), 502, 503, 504. 429 only when the server sent a
  ``Retry-After`` no longer than ``retry_after_cap``. Other 4xx never. A response
  that started and was then cut off (:attr:`FailureKind.BROKEN`) is final.
* :class:`RetryBudget`: a token bucket shared by every call of one client, so a
  broken backend sees at most about ``(1 + ratio)`` times the normal traffic plus
  ``min_per_second`` retries, instead of ``(1 + retries)`` times.
* :meth:`RetryPolicy.total_timeout`: the overall deadline of one call, the
  per-attempt timeout times the number of attempts, capped at ``max_total`` (30 s).

Typical driver loop (what ``eas_sdk.predict`` does)::

    decision = policy.after_status(status, headers, retry_index, remaining, rng)
    if decision.retry and budget.try_spend(now):
        sleep(decision.delay)
"""

from __future__ import annotations

import enum
import math
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from .constants import HEADER_RETRY_AFTER

DEFAULT_RETRIES = 5
DEFAULT_BACKOFF_BASE = 0.05
DEFAULT_BACKOFF_CAP = 2.0
DEFAULT_MAX_TOTAL = 30.0
ALWAYS_RETRYABLE_STATUSES = frozenset({450, 502, 503, 504})


class FailureKind(enum.Enum):
    """What went wrong on an attempt that produced no HTTP response."""

    CONNECT = "connect"  # could not connect: nothing was sent
    DISCONNECTED = "disconnected"  # connection closed/reset before any response byte
    TIMEOUT = "timeout"  # the attempt ran out of time (connect, pool wait or read)
    BROKEN = "broken"  # a response started but was cut off or malformed: never retried
    FATAL = "fatal"  # never retried (an invalid URL, a TLS set-up error)


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    delay: float = 0.0
    reason: str = ""


NO_RETRY = RetryDecision(False)


def parse_retry_after(value: str | None, now_epoch: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or an HTTP date).

    ``now_epoch`` (wall-clock seconds) is only needed for the date form.
    Returns None when absent or malformed; negative values become 0.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        if now_epoch is None:
            return None
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when is None:
            return None
        return max(0.0, when.timestamp() - now_epoch)
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return max(0.0, seconds)


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if value is not None:
        return value
    lower = name.lower()
    for key, val in headers.items():
        if key.lower() == lower:
            return val
    return None


@dataclass(frozen=True)
class RetryPolicy:
    """Immutable retry settings; see the module docstring for the rules."""

    retries: int = DEFAULT_RETRIES
    backoff_base: float = DEFAULT_BACKOFF_BASE
    backoff_cap: float = DEFAULT_BACKOFF_CAP
    retry_on_500: bool = True
    retry_on_timeout: bool = True
    # Longest Retry-After we are willing to wait for; a longer one surfaces the error.
    retry_after_cap: float = DEFAULT_BACKOFF_CAP
    max_total: float = DEFAULT_MAX_TOTAL
    # Immediate re-sends of a request whose *reused* pooled connection turned out dead
    # before any response byte (a stale keep-alive): they cost no attempt, no
    # back-off and no budget. A fresh connection that fails is an ordinary retry.
    stale_connection_retries: int = 1

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError("retries must be >= 0")
        if self.backoff_base < 0 or self.backoff_cap < 0:
            raise ValueError("back-off base and cap must be >= 0")
        if self.max_total <= 0:
            raise ValueError("max_total must be > 0")

    @property
    def attempts(self) -> int:
        return self.retries + 1

    def total_timeout(self, attempt_timeout: float) -> float:
        """Overall deadline of one call: attempt timeout x attempts, capped."""
        return min(attempt_timeout * self.attempts, self.max_total)

    def backoff_bound(self, retry_index: int) -> float:
        """Upper bound (exclusive) of the delay before retry ``retry_index`` (0-based)."""
        # 2**n overflows float for huge n; the cap is reached long before.
        exp = min(retry_index, 62)
        return min(self.backoff_cap, self.backoff_base * (1 << exp))

    def backoff(self, retry_index: int, rng: random.Random | None = None) -> float:
        """Full-jitter delay before retry ``retry_index``: uniform in [0, bound)."""
        bound = self.backoff_bound(retry_index)
        if bound <= 0:
            return 0.0
        r = (rng or random).random()  # in [0, 1): the delay never reaches the bound
        return r * bound

    def is_retryable_status(self, status: int, headers: Mapping[str, str] | None = None) -> bool:
        if status in ALWAYS_RETRYABLE_STATUSES:
            return True
        if status == 500:
            return self.retry_on_500
        if status == 429:
            wait = parse_retry_after(_header(headers, HEADER_RETRY_AFTER))
            return wait is not None and wait <= self.retry_after_cap
        return False

    def after_status(
        self,
        status: int,
        headers: Mapping[str, str] | None,
        retry_index: int,
        remaining: float,
        rng: random.Random | None = None,
        now_epoch: float | None = None,
    ) -> RetryDecision:
        """Decide about a non-200 response. ``retry_index`` = retries already made."""
        if retry_index >= self.retries:
            return NO_RETRY
        if status in ALWAYS_RETRYABLE_STATUSES or (status == 500 and self.retry_on_500):
            delay = self.backoff(retry_index, rng)
            hint = parse_retry_after(_header(headers, HEADER_RETRY_AFTER), now_epoch)
            if hint is not None:
                # Honour the server's hint, but never wait longer than the cap for it.
                delay = max(delay, min(hint, self.retry_after_cap))
        elif status == 429:
            hint = parse_retry_after(_header(headers, HEADER_RETRY_AFTER), now_epoch)
            if hint is None or hint > self.retry_after_cap:
                return NO_RETRY
            delay = hint
        else:
            return NO_RETRY
        if delay >= remaining:
            return NO_RETRY
        return RetryDecision(True, delay, f"status {status}")

    def after_failure(
        self,
        kind: FailureKind,
        retry_index: int,
        remaining: float,
        rng: random.Random | None = None,
    ) -> RetryDecision:
        """Decide about an attempt that got no HTTP response."""
        if retry_index >= self.retries:
            return NO_RETRY
        if kind is FailureKind.FATAL or kind is FailureKind.BROKEN:
            return NO_RETRY  # BROKEN: the server answered (part of) it; only pre-response failures retry
        if kind is FailureKind.TIMEOUT and not self.retry_on_timeout:
            return NO_RETRY
        delay = self.backoff(retry_index, rng)
        if delay >= remaining:
            return NO_RETRY
        return RetryDecision(True, delay, kind.value)


class RetryBudget:
    """Token bucket limiting retries to ``ratio`` of calls plus ``min_per_second``.

    Modelled on Finagle's RetryBudget: every call deposits ``ratio`` tokens (up to
    ``max_tokens``); a reserve refills at ``min_per_second`` and holds up to
    ``min_per_second * window`` tokens (full at start), so a quiet client can still
    retry a single failing call fully. A retry spends one token, from the ratio
    bucket first. Thread-safe; ``now`` is a monotonic time in seconds.

    Example: an always-503 backend at 100 calls/s for 5 s with the defaults sees at
    most 500 + 50 (ratio) + 30 (reserve) + 15 (refill) = 595 attempts, not 3,000.
    """

    def __init__(
        self,
        ratio: float = 0.1,
        min_per_second: float = 3.0,
        window: float = 10.0,
        max_tokens: float = 100.0,
        now: float = 0.0,
    ) -> None:
        if ratio < 0 or min_per_second < 0 or window < 0:
            raise ValueError("ratio, min_per_second and window must be >= 0")
        self.ratio = ratio
        self.min_per_second = min_per_second
        self.reserve_capacity = min_per_second * window
        self.max_tokens = max_tokens
        self._tokens = 0.0
        self._reserve = self.reserve_capacity
        self._last = now
        self._lock = threading.Lock()

    def on_call(self) -> None:
        with self._lock:
            self._tokens = min(self.max_tokens, self._tokens + self.ratio)

    def try_spend(self, now: float) -> bool:
        with self._lock:
            elapsed = max(0.0, now - self._last)
            self._last = max(self._last, now)
            self._reserve = min(self.reserve_capacity, self._reserve + elapsed * self.min_per_second)
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            if self._reserve >= 1.0:
                self._reserve -= 1.0
                return True
            return False

    def __repr__(self) -> str:
        return f"RetryBudget(ratio={self.ratio}, min_per_second={self.min_per_second})"


class UnlimitedBudget(RetryBudget):
    """A budget that never refuses (for tests and callers that opt out)."""

    def __init__(self) -> None:
        super().__init__(ratio=0.0, min_per_second=0.0)

    def try_spend(self, now: float) -> bool:
        return True
