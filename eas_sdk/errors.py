"""Exceptions raised by eas_sdk.

Every error raised by a client derives from :class:`PredictException`, the
compatible base of the original ``eas-prediction`` client (``code``,
``message``, ``str()`` format unchanged)::

    PredictException(code, message)
    ├── HTTPStatusError            the server answered with a non-200 status
    │   ├── ClientHTTPError        4xx
    │   │   ├── BadRequestError           400
    │   │   ├── AuthenticationError       401 / 403
    │   │   ├── NotFoundError             404
    │   │   ├── RequestTimeoutError       408
    │   │   ├── PayloadTooLargeError      413
    │   │   ├── TooManyRequestsError      429
    │   │   └── QueueFullError            450 (EAS: pending queue full)
    │   └── ServerHTTPError        5xx
    │       ├── ServiceUnavailableError   503
    │       └── GatewayTimeoutError       504
    ├── TransportError             no HTTP response: status None, code 500 (as the original)
    │   ├── ConnectError           connection refused / reset before a response
    │   └── TimeoutError           an attempt or the overall deadline ran out
    └── NoEndpointError            direct mode has no usable endpoint

The same failure raises the same type with the same ``code`` and ``status`` from every
client: predict and queue, blocking and asyncio. Every error carries:

* ``code``: the HTTP status, or 500 when no response came (``eas-prediction``'s value);
* ``status``: the HTTP status, or ``None`` when no response came (never invented);
* ``message``: text, never bytes: the server's own message when its body is one of the
  known error shapes (the gateway's and EAS's ``{"code", "message"}``, KServe's
  ``{"error"}``), else the body decoded as UTF-8; for a failure without a response,
  what went wrong and where;
* ``error_code``: the server's error code (``"ServiceNotFound"``), when it sent one;
* ``request_id``: the server's ``X-Request-Id`` (or the id the client sent);
* ``attempts``: how many attempts the call made before giving up (``None`` if unknown);
* ``body`` and ``headers`` (HTTP errors): the raw response body and headers.

Messages never contain tokens or signatures.
"""

from __future__ import annotations

import builtins
import http
import json
from collections.abc import Mapping

_MAX_MESSAGE = 4000  # characters of a server's message kept in ``message`` (``body`` has all)


class PredictException(Exception):
    """Compatible base: ``code`` is an HTTP-like status, ``message`` the reason as text.

    ``PredictException(code, message)`` as in ``eas-prediction``; the keyword fields are
    filled in by the clients (see the module documentation).
    """

    status: int | None = None

    def __init__(
        self,
        code: int,
        message: object,
        *,
        request_id: str | None = None,
        attempts: int | None = None,
        error_code: str | None = None,
    ) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.attempts = attempts
        self.error_code = error_code

    def __str__(self) -> str:
        return f"Code: {self.code}, Message: {self.message}"

    def __repr__(self) -> str:
        extra = "".join(
            f", {name}={value!r}"
            for name, value in (
                ("error_code", self.error_code),
                ("request_id", self.request_id),
                ("attempts", self.attempts),
            )
            if value is not None
        )
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r}{extra})"


class HTTPStatusError(PredictException):
    """The server answered with a status other than 200; ``status`` is that status."""

    def __init__(
        self,
        code: int,
        message: object,
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
        *,
        body: bytes = b"",
        attempts: int | None = None,
        error_code: str | None = None,
    ) -> None:
        super().__init__(code, message, request_id=request_id, attempts=attempts, error_code=error_code)
        self.headers: dict[str, str] = dict(headers or {})
        self.body = body

    @property  # type: ignore[override]
    def status(self) -> int:
        return self.code


class ClientHTTPError(HTTPStatusError):
    """4xx: the request was refused; sending it again unchanged will not help."""


class BadRequestError(ClientHTTPError):
    """400: the body could not be decoded, or does not fit the model."""


class AuthenticationError(ClientHTTPError):
    """401/403: a missing or wrong token or signature."""


class NotFoundError(ClientHTTPError):
    """404: no such service, queue or model."""


class RequestTimeoutError(ClientHTTPError):
    """408: the server timed the request out before it ran."""


class PayloadTooLargeError(ClientHTTPError):
    """413: the body is over the server's limit."""


class TooManyRequestsError(ClientHTTPError):
    """429: rate limited."""


class QueueFullError(ClientHTTPError):
    """450: the service's pending queue is full (EAS's own status); retried with back-off."""


class ServerHTTPError(HTTPStatusError):
    """5xx: the server failed the request."""


class ServiceUnavailableError(ServerHTTPError):
    """503: no worker of the service is ready."""


class GatewayTimeoutError(ServerHTTPError):
    """504: the worker did not answer in time."""


class TransportError(PredictException):
    """No HTTP response: ``status`` is ``None``; ``code`` is 500, the original client's value."""

    def __init__(
        self, message: object, code: int = 500, *, request_id: str | None = None, attempts: int | None = None
    ) -> None:
        super().__init__(code, message, request_id=request_id, attempts=attempts)


class ConnectError(TransportError):
    """The connection failed (refused, unreachable, reset) before any response byte."""


class TimeoutError(TransportError, builtins.TimeoutError):
    """An attempt, or the call's overall deadline, ran out of time."""


class NoEndpointError(PredictException):
    """Direct mode found no usable endpoint for the service."""

    def __init__(self, message: object = "no backend endpoint available", code: int = 500) -> None:
        super().__init__(code, message)


_STATUS_CLASSES: dict[int, type[HTTPStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    408: RequestTimeoutError,
    413: PayloadTooLargeError,
    429: TooManyRequestsError,
    450: QueueFullError,
    503: ServiceUnavailableError,
    504: GatewayTimeoutError,
}


def parse_error_body(status: int, body: bytes | str) -> tuple[str, str | None, str | None]:
    """``(message, error_code, request_id)`` from an error response body.

    Understands the gateway's and EAS's ``{"code", "message", "request_id"}`` and
    KServe's and Triton's ``{"error": "..."}``; any other body is its text. An empty body
    gives the status's reason phrase, so a message is never empty.
    """
    text = body.decode("utf-8", "replace") if isinstance(body, bytes | bytearray) else str(body)
    text = text.strip()
    code = request_id = None
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            found = data.get("message", data.get("error"))
            if isinstance(found, str):
                text = found
                code = data.get("code") if isinstance(data.get("code"), str) else None
                request_id = data.get("request_id") if isinstance(data.get("request_id"), str) else None
    if not text:
        try:
            text = http.HTTPStatus(status).phrase
        except ValueError:
            text = f"HTTP status {status}"
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE] + "..."
    return text, code, request_id


def error_for_status(
    status: int,
    body: bytes | str,
    headers: Mapping[str, str] | None = None,
    request_id: str | None = None,
    attempts: int | None = None,
) -> HTTPStatusError:
    """The most specific HTTPStatusError subclass for ``status``, its message as text.

    ``request_id``: the id the client sent; the server's ``X-Request-Id`` wins when present.
    """
    cls = _STATUS_CLASSES.get(status)
    if cls is None:
        cls = ServerHTTPError if status >= 500 else ClientHTTPError if status >= 400 else HTTPStatusError
    message, error_code, body_id = parse_error_body(status, body)
    headers = dict(headers or {})
    server_id = next((v for k, v in headers.items() if k.lower() == "x-request-id"), None)
    raw = body if isinstance(body, bytes) else bytes(body, "utf-8") if isinstance(body, str) else bytes(body)
    return cls(
        status,
        message,
        headers,
        server_id or body_id or request_id,
        body=raw,
        attempts=attempts,
        error_code=error_code,
    )
