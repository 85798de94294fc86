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
    ├── TransportError             no HTTP response (code 500, as the original)
    │   ├── ConnectError           connection refused / reset before a response
    │   └── TimeoutError           an attempt or the overall deadline ran out
    └── NoEndpointError            direct mode has no usable endpoint

Messages never contain tokens or signatures.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping


class PredictException(Exception):
    """Compatible base: ``code`` is an HTTP-like status, ``message`` the body or reason."""

    def __init__(self, code: int, message: object) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"Code: {self.code}, Message: {self.message}"


class HTTPStatusError(PredictException):
    def __init__(
        self,
        code: int,
        message: object,
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(code, message)
        self.headers: dict[str, str] = dict(headers or {})
        self.request_id = request_id

    @property
    def status(self) -> int:
        return self.code


class ClientHTTPError(HTTPStatusError):
    pass


class BadRequestError(ClientHTTPError):
    pass


class AuthenticationError(ClientHTTPError):
    pass


class NotFoundError(ClientHTTPError):
    pass


class RequestTimeoutError(ClientHTTPError):
    pass


class PayloadTooLargeError(ClientHTTPError):
    pass


class TooManyRequestsError(ClientHTTPError):
    pass


class QueueFullError(ClientHTTPError):
    pass


class ServerHTTPError(HTTPStatusError):
    pass


class ServiceUnavailableError(ServerHTTPError):
    pass


class GatewayTimeoutError(ServerHTTPError):
    pass


class TransportError(PredictException):
    def __init__(self, message: object, code: int = 500) -> None:
        super().__init__(code, message)


class ConnectError(TransportError):
    pass


class TimeoutError(TransportError, builtins.TimeoutError):
    pass


class NoEndpointError(PredictException):
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


def error_for_status(
    status: int,
    body: object,
    headers: Mapping[str, str] | None = None,
    request_id: str | None = None,
) -> HTTPStatusError:
    """The most specific HTTPStatusError subclass for ``status``."""
    cls = _STATUS_CLASSES.get(status)
    if cls is None:
        cls = ServerHTTPError if status >= 500 else ClientHTTPError if status >= 400 else HTTPStatusError
    return cls(status, body, headers, request_id)
