"""POST /api/predict/<service>[/<subpath>]: the EAS predict route (and the queue front door).

An aiohttp adapter over the dataplane (gateway/core/dataplane.py): it finds the service to
route by its kind, then makes one entry call (``predict_call``, or ``queue_call`` before
the queue's own handlers), which runs the checks in the core's order, cheapest first, so
hostile input costs nothing: service name (400) -> existence (404) -> wrong kind (400) ->
method (405) -> missing token, or a wrong raw token while the body is still arriving (401,
before reading) -> body hold (429) -> deadline header (400 / 408) -> body within
body_timeout_s (408) and max_body_bytes (413 before and while reading; a Content-Encoding:
415) -> token / signature (401, 400 BadDigest) -> dispatch (450 / 503 / 504). The worker's
status, content type and body pass through. Plain predict calls usually never get here:
the lean front (gateway/fronts/fast_front.py) makes the same call.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from eas_sdk._core.constants import (
    DEFAULT_CONTENT_TYPE,
    PREDICT_PATH_PREFIX,
    SINK_SUFFIX,
)
from gateway.config import ServiceConfig
from gateway.core import errors
from gateway.fronts.routes import raw_tail, split_service
from gateway.fronts.state import GATEWAY_KEY
from gateway.http.body import RequestBody
from gateway.http.middleware import request_id

log = logging.getLogger("gateway.predict")


async def _queue(request: web.Request, svc: ServiceConfig, subpath: str) -> web.StreamResponse:
    parts = request.app[GATEWAY_KEY]
    qm = parts.queues
    name = svc.name if not subpath else f"{svc.name}/{subpath}"
    if qm is None or subpath not in ("", SINK_SUFFIX) or not qm.has(name):
        raise errors.ServiceNotFound(f"queue {name!r} not found")
    gw = parts.config.gateway
    limit = min(gw.max_body_bytes, max(svc.queue.max_payload_bytes, 1))
    body = RequestBody(request, limit, gw.body_timeout_s, hold_limit=limit)
    await parts.dataplane.queue_call(
        svc, name, request.headers, request.rel_url.raw_path, body, method=request.method
    )
    resp: web.StreamResponse = await qm.handle(request, name)
    return resp


async def predict(request: web.Request) -> web.StreamResponse:
    app = request.app
    parts = app[GATEWAY_KEY]
    metrics = parts.metrics
    name, subpath = split_service(raw_tail(request, PREDICT_PATH_PREFIX))
    try:
        svc = parts.dataplane.find(name)
    except (errors.InvalidServiceName, errors.ServiceNotFound):
        metrics.unknown_service.inc()
        raise
    started = time.perf_counter()
    status = 500
    metrics.inflight.inc()
    try:
        if svc.processor == "queue" or svc.async_:
            resp = await _queue(request, svc, subpath)
        else:
            resp = await _predict(request, svc, subpath)
        status = resp.status
        return resp
    except errors.GatewayError as exc:
        status = exc.status
        raise
    except (asyncio.CancelledError, ConnectionError):
        status = 499  # nginx/EAS convention: client closed the request
        raise
    finally:
        metrics.inflight.dec()
        metrics.observe(svc.name, status, time.perf_counter() - started)


async def _predict(request: web.Request, svc: ServiceConfig, subpath: str) -> web.StreamResponse:
    parts = request.app[GATEWAY_KEY]
    gw = parts.config.gateway
    wresp = await parts.dataplane.predict_call(
        svc, request.headers, request.rel_url.raw_path,
        RequestBody(request, gw.max_body_bytes, gw.body_timeout_s, hold_limit=gw.max_body_bytes),
        method=request.method, subpath=subpath, request_id=request_id(request), arrived=time.monotonic(),
    )  # fmt: skip
    headers = {"Content-Type": wresp.content_type or DEFAULT_CONTENT_TYPE}
    extra = wresp.headers  # a backend's own answer headers (Server-Timing)
    if extra:
        headers.update(extra)
    return web.Response(status=int(wresp.status), body=wresp.body, headers=headers)


def setup(app: web.Application) -> None:
    app.router.add_route("*", PREDICT_PATH_PREFIX + r"{tail:[\s\S]*}", predict)
