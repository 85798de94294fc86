"""Reading a request body on aiohttp within the gateway's limits, and refusing before it.

Shared by every aiohttp adapter over the dataplane: the gateway's routes and the worker's
direct port (for the calls its lean protocol hands over).
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from eas_sdk._core.constants import HEADER_AUTHORIZATION
from gateway.config import ServiceConfig
from gateway.core import errors
from gateway.core.admission import BodyHold
from gateway.core.dataplane import DataPlane

# Inflating more than this much compressed input runs off the event loop.
_INFLATE_ON_LOOP_MAX = 64 << 10
# What a body still arriving holds against the gateway's admission budget (routes/body.py
# holds it before reading, releases it once read; the middleware releases any left over).
BODY_HOLD_KEY = web.RequestKey("body_hold", BodyHold)
# A chunked body (no Content-Length) holds this much unless the caller names its limit.
_CHUNKED_HOLD = 16 << 20


def inflate(data: bytes, encoding: str, max_bytes: int) -> bytes:
    """A gzip or deflate body, refused (413) once it inflates past ``max_bytes``: a small
    compressed body must not turn into unbounded memory."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    try:
        d = zlib.decompressobj(wbits)
        out = d.decompress(data, max_bytes + 1)
    except zlib.error:
        if encoding != "deflate":
            raise errors.BadRequest("the body is not valid gzip data") from None
        # Some clients send deflate without its zlib header (raw deflate).
        try:
            d = zlib.decompressobj(-zlib.MAX_WBITS)
            out = d.decompress(data, max_bytes + 1)
        except zlib.error:
            raise errors.BadRequest("the body is not valid deflate data") from None
    if len(out) > max_bytes or d.unconsumed_tail:
        raise errors.PayloadTooLarge(f"the decompressed body exceeds {max_bytes} bytes")
    if not d.eof:
        raise errors.BadRequest(f"the {encoding} body is truncated")
    return out


async def read_body(
    request: web.Request, max_bytes: int, timeout_s: float, *, decompress: bool = False
) -> bytes:
    """Read the whole body within limits; the result is cached on the request (request.read()).
    ``decompress``: a gzip or deflate body is inflated (within ``max_bytes``); otherwise any
    Content-Encoding is refused with 415."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return await _read_held(request, max_bytes, timeout_s)
    if not decompress or encoding not in ("gzip", "deflate"):
        raise errors.UnsupportedMediaType(f"Content-Encoding {encoding[:32]!r} is not supported", close=True)
    raw = await _read_held(request, max_bytes, timeout_s)
    if len(raw) > _INFLATE_ON_LOOP_MAX:
        return await asyncio.to_thread(inflate, raw, encoding, max_bytes)
    return inflate(raw, encoding, max_bytes)


async def _read_held(request: web.Request, max_bytes: int, timeout_s: float) -> bytes:
    try:
        return await _read_raw(request, max_bytes, timeout_s)
    finally:
        release_body(request)


def release_body(request: web.Request) -> None:
    """Give back what the request's body held against the admission budget (idempotent)."""
    hold = request.get(BODY_HOLD_KEY)
    if hold is not None:
        hold.release()


async def _read_raw(request: web.Request, max_bytes: int, timeout_s: float) -> bytes:
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


def refuse_before_body(
    plane: DataPlane, svc: ServiceConfig, request: web.Request, key: str = "", max_bytes: int = 0
) -> None:
    """401 before the body is read: no token at all; or, while the body is still arriving, a
    raw token that is wrong (a body already in costs nothing to read, and the dataplane then
    looks at the token once). A body still arriving is then admitted (429 when the gateway
    receives too much already): it holds its length, or ``max_bytes`` when chunked."""
    arriving = request.body_exists and not request.content.is_eof()
    if svc.tokens and (
        not request.headers.get(HEADER_AUTHORIZATION)
        or (arriving and plane.refused_early(svc, request.headers, key))
    ):
        raise errors.Unauthorized("invalid or missing token")
    if arriving and BODY_HOLD_KEY not in request:
        # The route's limit, else the application's: a longer body is refused (413) unread.
        limit = max_bytes or request.client_max_size or _CHUNKED_HOLD
        nbytes = min(request.content_length or limit, limit)
        request[BODY_HOLD_KEY] = plane.hold_body(svc, request.headers, nbytes)
