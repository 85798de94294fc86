"""The gateway's error statuses as gRPC status codes: one table, for every gRPC call.

A ``GatewayError`` carries the HTTP-style status that every other entry point answers
with (gateway/core/errors.py); a gRPC client gets the code that means the same, the same
message, and the gateway's request id (and ``retry-after`` when the error has one) in
the trailing metadata.
"""

from __future__ import annotations

import grpc

from eas_sdk._core.constants import HEADER_RETRY_AFTER
from gateway.core.errors import GatewayError

STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    450: grpc.StatusCode.RESOURCE_EXHAUSTED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_code(status: int) -> grpc.StatusCode:
    """The gRPC code for a gateway status: INTERNAL for anything the table does not name."""
    return STATUS_CODES.get(status, grpc.StatusCode.INTERNAL)


def trailers(exc: GatewayError, request_id: str) -> tuple[tuple[str, str], ...]:
    """What travels beside the status: the request id, and when to retry."""
    out = [("x-request-id", request_id)] if request_id else []
    retry = exc.headers.get(HEADER_RETRY_AFTER)
    if retry is not None:
        out.append(("retry-after", retry))
    return tuple(out)


__all__ = ["STATUS_CODES", "grpc_code", "trailers"]
