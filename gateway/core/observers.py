"""What the dataplane tells the layers above it about the calls it runs, as Protocols they
implement (the core imports none of them): the metrics (``DispatchObserver``) and the
payload log (``PayloadObserver``), with the one wrapper that hands a call to the latter."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from typing import Protocol, TypeVar

import numpy as np

from gateway.config import ServiceConfig
from gateway.core import errors
from gateway.core.calls import WorkerResponse

log = logging.getLogger("gateway.dataplane")

# What an entry call answers: a worker's response, output arrays.
R = TypeVar("R")
# A call's request as the payload log sees it: the bytes the client sent, or its input arrays
# when the transport decoded them (gRPC).
Request = bytes | Mapping[str, np.ndarray] | None
Answer = WorkerResponse | Mapping[str, np.ndarray] | None


class DispatchObserver(Protocol):
    """Told of every call a backend ran (the gateway's metrics): ``svc`` is the service that
    ran it, an older model version's own (``name@version``) included."""

    def observe_dispatch(
        self, svc: ServiceConfig, status: int, seconds: float, compute_us: int, body: bytes
    ) -> None:
        """The backend answered (``status``, ``body``: its answer, read only when it failed)."""
        ...

    def observe_failure(self, svc: ServiceConfig, error: errors.GatewayError, seconds: float) -> None:
        """The backend did not answer: refused, timed out, lost its worker; or too large."""
        ...

    def observe_mirror(
        self, service: str, mirror: str, outcome: str | None, seconds: float, in_flight: int
    ) -> None:
        """A copy of one of ``service``'s calls to its mirror left (``outcome`` None) or ended
        (gateway.core.mirror): ``outcome`` the status it was answered with, or ``shed`` when it
        was not sent; ``in_flight`` the copies running now."""
        ...


class PayloadObserver(Protocol):
    """Told of each call of a service that logs its payloads (``payload_log``), once it is
    answered or failed: the gateway's payload log (gateway.observability.payloads), which
    samples, copies what it keeps and returns at once."""

    def payload(
        self,
        svc: ServiceConfig,
        request_id: str,
        headers: Mapping[str, str],
        request: Request,
        answer: Answer,
        error: errors.GatewayError | None,
    ) -> None: ...


async def logged(
    observer: PayloadObserver,
    svc: ServiceConfig,
    request_id: str,
    headers: Mapping[str, str],
    request: Request,
    work: Awaitable[R],
) -> R:
    """Run ``work`` (a call of a service with a payload log) and tell ``observer`` how it
    went. The observer's own failure is logged, never the call's: it neither fails nor
    delays the call it records."""
    try:
        answer = await work
    except errors.GatewayError as exc:
        _tell(observer, svc, request_id, headers, request, None, exc)
        raise
    _tell(observer, svc, request_id, headers, request, answer, None)  # type: ignore[arg-type]
    return answer


def _tell(
    observer: PayloadObserver,
    svc: ServiceConfig,
    request_id: str,
    headers: Mapping[str, str],
    request: Request,
    answer: Answer,
    error: errors.GatewayError | None,
) -> None:
    try:
        observer.payload(svc, request_id, headers, request, answer, error)
    except Exception:
        log.exception("the payload log failed", extra={"request_id": request_id})


__all__ = ["DispatchObserver", "PayloadObserver", "logged"]
