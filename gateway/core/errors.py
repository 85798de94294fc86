"""Errors the gateway answers with: a stable code, an HTTP status and a message.

Each protocol writes them in its own shape (gateway/codecs/errors.py renders every one).
Messages are written for clients: they never carry tokens, signatures, file paths or
tracebacks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from eas_sdk._core.constants import HEADER_RETRY_AFTER

log = logging.getLogger("gateway.errors")


class GatewayError(Exception):
    """An error with a client-facing status, code and message."""

    status: int = 500
    code: str = "InternalError"

    def __init__(
        self,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = dict(headers or {})
        # Close the connection after answering (unread body, slow client).
        self.close = close


class InvalidServiceName(GatewayError):
    status, code = 400, "InvalidServiceName"


class BadRequest(GatewayError):
    status, code = 400, "BadRequest"


class BadDigest(GatewayError):
    status, code = 400, "BadDigest"


class WrongServiceKind(GatewayError):
    """A queue call (a QueueClient's) to a synchronous predict service."""

    status, code = 400, "WrongServiceKind"


class Unauthorized(GatewayError):
    status, code = 401, "Unauthorized"


class Forbidden(GatewayError):
    status, code = 403, "Forbidden"


class ServiceNotFound(GatewayError):
    status, code = 404, "ServiceNotFound"


class NotFound(GatewayError):
    status, code = 404, "NotFound"


class MethodNotAllowed(GatewayError):
    status, code = 405, "MethodNotAllowed"

    def __init__(self, message: str, allow: str) -> None:
        super().__init__(message, headers={"Allow": allow})


class RequestTimeout(GatewayError):
    status, code = 408, "RequestTimeout"


class DeadlineExceeded(GatewayError):
    status, code = 408, "DeadlineExceeded"


class Conflict(GatewayError):
    """A service of that name already exists (the admin API's create)."""

    status, code = 409, "Conflict"


class RolloutFailed(GatewayError):
    """The new version of a service did not start; the running version keeps serving."""

    status, code = 422, "RolloutFailed"


class PayloadTooLarge(GatewayError):
    status, code = 413, "PayloadTooLarge"


class ResponseTooLarge(GatewayError):
    """The answer would exceed ``gateway.max_response_bytes`` (its size followed from the input)."""

    status, code = 413, "ResponseTooLarge"


class TooManyRequests(GatewayError):
    """429: a gateway-wide limit (admission) is reached; retry later."""

    status, code = 429, "TooManyRequests"

    def __init__(self, message: str, retry_after_s: int = 1, *, close: bool = False) -> None:
        super().__init__(message, headers={HEADER_RETRY_AFTER: str(retry_after_s)}, close=close)


class UnsupportedMediaType(GatewayError):
    status, code = 415, "UnsupportedMediaType"


class TooManyPending(GatewayError):
    """EAS 450: the service's pending queue is full."""

    status, code = 450, "TooManyPending"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={HEADER_RETRY_AFTER: str(retry_after_s)})


class ServiceNotReady(GatewayError):
    status, code = 503, "ServiceNotReady"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={HEADER_RETRY_AFTER: str(retry_after_s)})


class UpstreamTimeout(GatewayError):
    status, code = 504, "UpstreamTimeout"


class InternalError(GatewayError):
    status, code = 500, "InternalError"


class ProcessorFailed(GatewayError):
    """The processor answered an error of its own: its status and message, passed on."""

    code = "ProcessorFailed"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# Codes for statuses raised by aiohttp itself (router 404/405, parser 400, ...).
HTTP_STATUS_CODES: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    409: "Conflict",
    413: "PayloadTooLarge",
    415: "UnsupportedMediaType",
    429: "TooManyRequests",
    450: "TooManyPending",
    500: "InternalError",
    503: "ServiceNotReady",
    504: "UpstreamTimeout",
}


def from_exception(exc: BaseException) -> GatewayError:
    """The one table from a dispatch failure to the error a client is answered with.

    The pool's own errors (overloaded, no ready worker, timeout) are GatewayErrors already;
    a bare timeout means the worker did not answer in time; anything else is a defect and
    is answered 500 without details (the caller logs the exception)."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout("the worker did not answer in time")
    log.error("dispatch failed", exc_info=exc)
    return InternalError("internal error")


def of_status(
    status: int, message: str, *, headers: Mapping[str, str] | None = None, close: bool = False
) -> GatewayError:
    """A GatewayError for a status decided elsewhere (aiohttp's router and parser, a
    protocol's own request error), with the code of that status."""
    exc = GatewayError(message, headers=headers, close=close)
    exc.status = status
    exc.code = HTTP_STATUS_CODES.get(status, "Error")
    return exc


def message_of(body: bytes) -> str:
    """The message inside a processor's JSON error body, or the body as text."""
    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    return str(doc.get("message", text)) if isinstance(doc, dict) else text
