"""How the SDK's clients move bytes: one interface, a blocking and an asyncio transport.

Every client (predict and queue, sync and async) sends through these; retry,
signing and endpoint choice stay in the I/O-free core (``eas_sdk._core``).
``MockTransport`` answers from a function, for tests.
"""

from __future__ import annotations

from ._shared import COALESCE_MAX_BODY, DEFAULT_KEEPALIVE_EXPIRY
from .aio import AsyncHTTPTransport
from .base import AsyncBaseTransport, BaseTransport, Request, Response, TransportFailure
from .mock import MockTransport
from .sync import HTTPTransport

__all__ = [
    "COALESCE_MAX_BODY",
    "DEFAULT_KEEPALIVE_EXPIRY",
    "AsyncBaseTransport",
    "AsyncHTTPTransport",
    "BaseTransport",
    "HTTPTransport",
    "MockTransport",
    "Request",
    "Response",
    "TransportFailure",
]
