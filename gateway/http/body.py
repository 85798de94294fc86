"""Reading a request body on aiohttp within the gateway's limits.

Shared by every aiohttp adapter over the dataplane: the gateway's routes and the worker's
direct port (for the calls its lean protocol hands over). :class:`RequestBody` is how they
hand a body still to be read to the dataplane's entry calls, which decide when it is
refused unread, held against the admission budget and read.
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from gateway.core import errors

# Inflating more than this much compressed input runs off the event loop.
_INFLATE_ON_LOOP_MAX = 64 << 10
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
        return await _read_raw(request, max_bytes, timeout_s)
    if not decompress or encoding not in ("gzip", "deflate"):
        raise errors.UnsupportedMediaType(f"Content-Encoding {encoding[:32]!r} is not supported", close=True)
    raw = await _read_raw(request, max_bytes, timeout_s)
    if len(raw) > _INFLATE_ON_LOOP_MAX:
        return await asyncio.to_thread(inflate, raw, encoding, max_bytes)
    return inflate(raw, encoding, max_bytes)


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


class RequestBody:
    """An aiohttp request's body as the dataplane's entry calls take it (its ``BodyReader``):
    read within ``max_bytes`` and ``timeout_s`` (``decompress``: see :func:`read_body`);
    while it arrives it holds its length, or ``hold_limit`` (the application's body limit
    when 0) when chunked or longer."""

    __slots__ = ("decompress", "hold_limit", "max_bytes", "request", "timeout_s")

    def __init__(
        self,
        request: web.Request,
        max_bytes: int,
        timeout_s: float,
        *,
        decompress: bool = False,
        hold_limit: int = 0,
    ) -> None:
        self.request = request
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.decompress = decompress
        self.hold_limit = hold_limit

    @property
    def arriving(self) -> bool:
        request = self.request
        return request.body_exists and not request.content.is_eof()

    @property
    def hold_bytes(self) -> int:
        # The route's limit, else the application's: a longer body is refused (413) unread.
        limit = self.hold_limit or self.request.client_max_size or _CHUNKED_HOLD
        return min(self.request.content_length or limit, limit)

    @property
    def empty(self) -> bool:
        return not self.request.can_read_body

    async def read(self) -> bytes:
        return await read_body(self.request, self.max_bytes, self.timeout_s, decompress=self.decompress)
