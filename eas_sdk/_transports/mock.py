"""An in-memory transport for tests: a function answers each request (as httpx's MockTransport).

``handler(request) -> Response`` may also raise: a :class:`TransportFailure` is passed
on as it is, any other exception is classified like one a real transport hit after
sending (``ConnectionRefusedError`` counts as a failed connect, nothing sent).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from .._core.failures import classify
from .base import AsyncBaseTransport, BaseTransport, Request, Response, TransportFailure

Handler = Callable[[Request], "Response | Awaitable[Response]"]


class MockTransport(BaseTransport, AsyncBaseTransport):
    """Answers every request with ``handler(request)``; ``requests`` lists what was sent."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []
        self.closed = False

    def _failure(self, exc: Exception) -> TransportFailure:
        if isinstance(exc, TransportFailure):
            return exc
        return TransportFailure(exc, sent=not isinstance(exc, ConnectionRefusedError), kind=classify(exc))

    def handle_request(self, request: Request) -> Response:
        self.requests.append(request)
        try:
            result = self.handler(request)
        except Exception as exc:
            raise self._failure(exc) from None
        if inspect.isawaitable(result):
            raise TypeError("an async handler needs handle_async_request")
        return result

    async def handle_async_request(self, request: Request) -> Response:
        self.requests.append(request)
        try:
            result = self.handler(request)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            raise self._failure(exc) from None
        return result

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True
