"""The transport interface: one request in, one complete response out, or a failure.

A transport only moves bytes. Which URL, which headers, whether to retry and how
long to wait live in the I/O-free core (``eas_sdk._core``); a transport reports
what happened, classified once (:class:`TransportFailure`), and the core decides.
The shape follows httpx's ``BaseTransport.handle_request``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from .._core.failures import FailureKind, classify, describe


class Request(NamedTuple):
    """One attempt: ``timeout`` (seconds) bounds all of it, pool wait to last body byte.

    ``idempotent=False`` marks a request that must not reach the server twice (a
    queue ``get`` that deletes what it reads): the transport then checks that an
    idle pooled connection is still open before it sends on it.
    """

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes | None
    timeout: float
    idempotent: bool = True


class Response(NamedTuple):
    status: int
    headers: Mapping[str, str]
    body: bytes


class TransportFailure(Exception):
    """An attempt that produced no complete response.

    ``kind`` is the classification of ``cause`` (see ``eas_sdk._core.failures``);
    ``reused`` says the request went out on a pooled keep-alive connection (not one
    opened for it), ``started`` that part of the response had arrived, ``sent``
    that bytes of the request may have reached the server.
    """

    def __init__(
        self,
        cause: BaseException,
        *,
        kind: FailureKind | None = None,
        reused: bool = False,
        started: bool = False,
        sent: bool = True,
    ) -> None:
        super().__init__(describe(cause))
        self.cause = cause
        self.kind = classify(cause) if kind is None else kind
        self.reused = reused
        self.started = started
        self.sent = sent and self.kind is not FailureKind.CONNECT

    @property
    def reason(self) -> str:
        return str(self)


class BaseTransport:
    """A blocking transport, safe to share between threads."""

    def handle_request(self, request: Request) -> Response:  # pragma: no cover - interface
        """Send ``request``; return the whole response or raise :class:`TransportFailure`."""
        raise NotImplementedError

    def close(self) -> None:
        """Close pooled connections; the transport may be used again afterwards."""


class AsyncBaseTransport:
    """An asyncio transport (one event loop)."""

    async def handle_async_request(self, request: Request) -> Response:  # pragma: no cover - interface
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close pooled connections."""
