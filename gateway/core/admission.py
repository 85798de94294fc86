"""Gateway-wide admission: how many connections, how many body bytes being received, how
many calls per service in flight. One :class:`Admission` per gateway, owned by the dataplane
(``DataPlane.admission``); entry points ask it, nothing else keeps such counts.

* connections: past ``max_connections`` open connections a new one is answered 503 and closed;
* body bytes being received: a request whose body is still arriving holds its declared
  length (its limit when chunked) until the body is in; past ``max_buffered_bytes`` in all,
  or ``max_unverified_bytes`` for calls that cannot be authenticated before their body (an
  ``EAS`` signature covers the body), a new body is refused with 429 before it is read;
* calls in flight per service: past ``max_inflight_per_service`` a call is refused with 429.

Every refusal is counted by reason, and every figure is exported on ``/metrics``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.config import GatewayConfig
from gateway.core import errors


@dataclass(frozen=True)
class AdmissionLimits:
    """The limits; 0 turns one off. Defaults are ``GatewayConfig``'s."""

    max_connections: int = 2048
    max_buffered_bytes: int = 256 << 20
    max_unverified_bytes: int = 64 << 20
    max_inflight_per_service: int = 1024

    @classmethod
    def of(cls, gateway: GatewayConfig) -> AdmissionLimits:
        """The limits in a ``GatewayConfig``."""
        return cls(
            max_connections=int(gateway.max_connections),
            max_buffered_bytes=int(gateway.max_buffered_bytes),
            max_unverified_bytes=int(gateway.max_unverified_bytes),
            max_inflight_per_service=int(gateway.max_inflight_per_service),
        )


class BodyHold:
    """Bytes held for one body while it is received; ``release`` is idempotent."""

    __slots__ = ("_admission", "nbytes", "verified")

    def __init__(self, admission: Admission, nbytes: int, verified: bool) -> None:
        self._admission: Admission | None = admission
        self.nbytes = nbytes
        self.verified = verified

    def release(self) -> None:
        adm, self._admission = self._admission, None
        if adm is not None:
            adm.buffered -= self.nbytes
            if not self.verified:
                adm.unverified -= self.nbytes


class Admission:
    """The counters and the decisions; see the module docstring. Event-loop only."""

    def __init__(self, limits: AdmissionLimits | None = None) -> None:
        self.limits = limits or AdmissionLimits()
        # How many connections are open: set by the listener, which knows them all.
        self.open_connections: Callable[[], int] = lambda: 0
        self.buffered = 0
        self.unverified = 0
        self.inflight: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    # ------------------------------------------------------------------ connections
    def admit_connection(self) -> bool:
        """May one more connection open? False (counted as refused) at the limit."""
        cap = self.limits.max_connections
        if cap and self.open_connections() >= cap:
            self.refused["connections"] += 1
            return False
        return True

    # ------------------------------------------------------------------ bodies
    def hold_body(self, nbytes: int, *, verified: bool) -> BodyHold:
        """Hold ``nbytes`` for a body about to be received, or raise TooManyRequests (the
        connection is closed after the answer: its body is not read)."""
        lim = self.limits
        if lim.max_buffered_bytes and self.buffered + nbytes > lim.max_buffered_bytes:
            self.refused["buffered_bytes"] += 1
            raise errors.TooManyRequests("the gateway is receiving too many request bodies", close=True)
        if not verified and lim.max_unverified_bytes and self.unverified + nbytes > lim.max_unverified_bytes:
            self.refused["unverified_bytes"] += 1
            raise errors.TooManyRequests(
                "too many unauthenticated request bodies are being received", close=True
            )
        self.buffered += nbytes
        if not verified:
            self.unverified += nbytes
        return BodyHold(self, nbytes, verified)

    # ------------------------------------------------------------------ calls
    def enter(self, service: str) -> None:
        """Count a call to ``service`` in flight, or raise TooManyRequests past the limit."""
        cap = self.limits.max_inflight_per_service
        if cap and self.inflight[service] >= cap:
            self.refused["inflight"] += 1
            raise errors.TooManyRequests(f"service {service!r} has {cap} calls in flight")
        self.inflight[service] += 1

    def leave(self, service: str) -> None:
        self.inflight[service] -= 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "connections": self.open_connections(),
            "buffered_bytes": self.buffered,
            "unverified_bytes": self.unverified,
            "inflight": dict(self.inflight),
            "refused": dict(self.refused),
            "limits": dict(self.limits.__dict__),
        }


__all__ = ["Admission", "AdmissionLimits", "BodyHold"]
