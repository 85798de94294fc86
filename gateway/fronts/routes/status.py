"""The status page: ``GET /status`` (the page), ``GET /status/events`` (its live stream,
server-sent events, one snapshot a second), ``GET /api/status`` (one snapshot, JSON; what
``eas-gateway status`` prints) and ``GET /api/status/history`` (the last hour, JSON, column
by column; ``?since=<unix seconds>`` for the points after a time). The snapshot is
``gateway.observability.status``'s, the history ``gateway.observability.history``'s.

Everything the page needs is served from here (no external script, style or font: its
charts are drawn by uPlot, vendored in ``gateway/static`` with its licence), and
only to loopback callers or with the admin token (gateway.fronts.status_access: a bearer header,
or the cookie the page's sign-in form, ``POST /status/login``, sets). A browser elsewhere
asking for the page gets the sign-in form.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from importlib import resources

from aiohttp import web

from gateway.core import errors
from gateway.fronts import status_access
from gateway.fronts.state import GATEWAY_KEY
from gateway.observability.status import SAMPLE_INTERVAL_S, StatusSampler

PAGE = "status.html"
# The files the page loads besides itself, and their types: nothing else is served.
ASSETS = {
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "uPlot.LICENSE": "text/plain",
}


async def page(request: web.Request) -> web.Response:
    if not status_access.allowed(request):
        return status_access.sign_in_page()
    html = resources.files("gateway").joinpath("static", PAGE).read_text(encoding="utf-8")
    return web.Response(text=html, content_type="text/html", headers=status_access.PAGE_HEADERS)


async def snapshot(request: web.Request) -> web.Response:
    status_access.check(request)
    return web.json_response(request.app[SAMPLER_KEY].snapshot())


async def history(request: web.Request) -> web.Response:
    status_access.check(request)
    raw = request.query.get("since")
    try:
        since = float(raw) if raw else None
    except ValueError:
        raise errors.BadRequest("since must be a number of seconds since the epoch") from None
    return web.json_response(request.app[SAMPLER_KEY].history.to_json(since))


async def asset(request: web.Request) -> web.Response:
    status_access.check(request)
    name = request.match_info["name"]
    ctype = ASSETS.get(name)
    if ctype is None:
        raise web.HTTPNotFound()
    data = resources.files("gateway").joinpath("static", name).read_bytes()
    return web.Response(body=data, content_type=ctype, headers={"Cache-Control": "max-age=3600"})


async def events(request: web.Request) -> web.StreamResponse:
    status_access.check(request)
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
    await resp.prepare(request)
    sampler = request.app[SAMPLER_KEY]
    try:
        while not sampler.stopping.is_set():
            data = json.dumps(sampler.snapshot(), separators=(",", ":"))
            await resp.write(f"event: status\ndata: {data}\n\n".encode())
            try:
                await asyncio.wait_for(sampler.stopping.wait(), SAMPLE_INTERVAL_S)
            except TimeoutError:
                pass
    except ConnectionResetError:
        pass  # the page was closed
    return resp


async def _end_streams(app: web.Application) -> None:
    """End the live streams at shutdown: aiohttp waits for open handlers before it stops."""
    app[SAMPLER_KEY].stopping.set()


SAMPLER_KEY = web.AppKey("status_sampler", StatusSampler)


async def sampler_context(app: web.Application) -> AsyncIterator[None]:
    """Runs the sampler while the app runs (an aiohttp cleanup context)."""
    sampler = app[SAMPLER_KEY]
    task = asyncio.create_task(sampler.run(), name="status-sampler")
    yield
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


def setup(app: web.Application) -> None:
    parts = app[GATEWAY_KEY]
    app[SAMPLER_KEY] = StatusSampler(
        parts.config,
        parts.metrics,
        parts.state,
        parts.backends,
        parts.queues,
        parts.config.gateway.status_history_interval_s,
    )
    app.cleanup_ctx.append(sampler_context)
    app.on_shutdown.append(_end_streams)
    app.router.add_get("/status", page)
    app.router.add_get("/status/events", events)
    app.router.add_post(status_access.LOGIN_PATH, status_access.login)
    app.router.add_get("/status/assets/{name}", asset)
    app.router.add_get("/api/status", snapshot)
    app.router.add_get("/api/status/history", history)
