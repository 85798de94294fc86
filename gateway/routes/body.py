"""Reading a request body on aiohttp within the gateway's limits, and refusing before it.

Shared by every aiohttp adapter over the dataplane: the gateway's routes and the worker's
direct port (for the calls its lean protocol hands over).
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from eas_sdk._core.constants import HEADER_AUTHORIZATION
from gateway import errors
from gateway.config import ServiceConfig
from gateway.dataplane import DataPlane


async def read_body(request: web.Request, max_bytes: int, timeout_s: float) -> bytes:
    """Read the whole body within limits; the result is cached on the request (request.read())."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise errors.UnsupportedMediaType(f"Content-Encoding {encoding[:32]!r} is not supported", close=True)
    length = request.content_length
    if length is not None and length > max_bytes:
        raise errors.PayloadTooLarge(f"request body exceeds {max_bytes} bytes", close=True)
    try:
        if request.content.is_eof():
            # Already received in full (small bodies): nothing to wait for, so no timer task.
            return await request.read()
        return await asyncio.wait_for(request.read(), timeout_s)
    except asyncio.TimeoutError:
        raise errors.RequestTimeout(f"request body not received within {timeout_s:g} s", close=True) from None
    except web.HTTPRequestEntityTooLarge:
        raise errors.PayloadTooLarge(f"request body exceeds {max_bytes} bytes", close=True) from None
    except RequestPayloadError:
        raise errors.BadRequest("malformed request body", close=True) from None


def refuse_before_body(plane: DataPlane, svc: ServiceConfig, request: web.Request, key: str = "") -> None:
    """401 before the body is read: no token at all; or, while the body is still arriving, a
    raw token that is wrong (a body already in costs nothing to read, and the dataplane then
    looks at the token once)."""
    if not svc.tokens:
        return
    if not request.headers.get(HEADER_AUTHORIZATION) or (
        not request.content.is_eof() and plane.refused_early(svc, request.headers, key)
    ):
        raise errors.Unauthorized("invalid or missing token")
