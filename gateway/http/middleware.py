"""Request id and error mapping: every response carries X-Request-Id, every error is JSON.

A sane incoming ``X-Request-Id`` (letters, digits, ``._:-``, up to 128 chars)
is kept so callers can correlate; anything else is replaced by a fresh id from
``secrets`` (never reflected, so no header injection). Errors are rendered by
gateway/codecs/errors.py: ``{"code", "message", "request_id"}`` bodies, or ``{"error"}`` on
KServe and Triton paths; an unexpected exception is logged with its traceback and
answered with a bare 500 InternalError.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets

from aiohttp import web
from aiohttp.typedefs import Handler

from eas_sdk._core.constants import HEADER_REQUEST_ID
from gateway.codecs.errors import ErrorAnswer, Shape, internal, render
from gateway.core.errors import GatewayError, of_status

log = logging.getLogger("gateway.request")

REQUEST_ID_KEY = web.RequestKey("request_id", str)
_RID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


_RID_POOL: list[str] = []


def new_request_id() -> str:
    # 128 random bits from ``secrets`` as before, drawn 64 ids at a time (one call, not 64).
    if not _RID_POOL:
        raw = secrets.token_hex(16 * 64)
        _RID_POOL.extend(raw[i : i + 32] for i in range(0, len(raw), 32))
    return _RID_POOL.pop()


def pick_request_id(incoming: str | None) -> str:
    if incoming and _RID_RE.match(incoming):
        return incoming
    return new_request_id()


def request_id(request: web.Request) -> str:
    return request.get(REQUEST_ID_KEY) or "-"


def error_response(answer: ErrorAnswer) -> web.Response:
    """A rendered error (gateway.codecs.errors.render) as an aiohttp response."""
    headers = {**answer.headers, "Content-Type": answer.content_type}
    resp = web.Response(status=answer.status, body=answer.body, headers=headers)
    if answer.close:
        resp.force_close()
    return resp


def _kserve_path(path: str) -> bool:
    return path == "/v2" or path.startswith(("/v1/", "/v2/"))


def _error(request: web.Request, exc: GatewayError, rid: str) -> web.Response:
    """The gateway's error shape; on KServe and Triton paths their ``{"error": ...}`` shape,
    which their clients read (for the errors the gateway and aiohttp raise themselves too:
    an unknown path or method)."""
    shape = Shape.V2 if _kserve_path(request.path) else Shape.EAS
    resp = error_response(render(exc, shape, rid))
    resp.headers[HEADER_REQUEST_ID] = rid
    return resp


@web.middleware
async def gateway_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    rid = pick_request_id(request.headers.get(HEADER_REQUEST_ID))
    request[REQUEST_ID_KEY] = rid
    try:
        resp = await handler(request)
    except GatewayError as exc:
        return _error(request, exc, rid)
    except web.HTTPException as exc:
        # Raised by aiohttp (router 404/405, 413 from read(), ...): same shape.
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
        err = of_status(exc.status, "", headers=headers, close=exc.status in (408, 413))
        err.message = exc.reason or err.code
        return _error(request, err, rid)
    except (asyncio.CancelledError, ConnectionError):
        # The client went away: nothing to answer, nothing worth a traceback.
        log.debug("client disconnected", extra={"request_id": rid})
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.rel_url.raw_path,
                      extra={"request_id": rid})  # fmt: skip
        return _error(request, internal(), rid)
    if not resp.prepared:
        resp.headers[HEADER_REQUEST_ID] = rid
    return resp
