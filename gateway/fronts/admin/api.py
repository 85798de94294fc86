"""The admin API: the service manager over HTTP, on its own listener and token.

Configured by ``admin: {host, port, token}`` (off without it; a non-loopback host needs a
token). Every call carries ``Authorization: Bearer <token>`` (or the bare token) when a
token is set. Bodies are service descriptions in JSON or YAML, the schema of the config
file's ``services:`` entries; answers are JSON, errors the gateway's
``{"code", "message", "request_id"}``. The OpenAPI description is at ``/admin/openapi.json``.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway import __version__
from gateway.config import SERVICE_NAME_RE, ConfigError
from gateway.core import errors
from gateway.fronts.admin.openapi import OPENAPI
from gateway.fronts.admin.queues import add_routes as add_queue_routes
from gateway.fronts.state import GATEWAY_KEY
from gateway.http.middleware import gateway_middleware
from gateway.manage.manager import ServiceManager
from gateway.manage.spec import parse_body

log = logging.getLogger("gateway.manage")

MAX_BODY = 1 << 20


def token_matches(header: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>`` or the bare token, compared in constant time."""
    if not header:
        return False
    value = header[7:] if header[:7].lower() == "bearer " else header
    return hmac.compare_digest(value.strip().encode(), token.encode())


def _auth(token: str | None) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token and request.path != "/admin/openapi.json":
            if not token_matches(request.headers.get("Authorization"), token):
                raise errors.Unauthorized("invalid or missing admin token")
        return await handler(request)

    return check


def _manager(request: web.Request) -> ServiceManager:
    return request.app[GATEWAY_KEY].manager


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not SERVICE_NAME_RE.fullmatch(name):
        raise errors.InvalidServiceName("invalid service name")
    return name


async def _body(request: web.Request) -> Any:
    body = await request.read()
    try:
        return parse_body(body, request.content_type)
    except ConfigError as exc:
        raise errors.BadRequest(str(exc)) from None


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(doc), status=status, content_type="application/json")


async def list_services(request: web.Request) -> web.Response:
    return _json({"services": _manager(request).list()})


async def get_service(request: web.Request) -> web.Response:
    return _json(_manager(request).describe(_name(request)))


async def create_service(request: web.Request) -> web.Response:
    return _json(await _manager(request).create(await _body(request)), 201)


async def update_service(request: web.Request) -> web.Response:
    return _json(await _manager(request).update(_name(request), await _body(request)))


async def scale_service(request: web.Request) -> web.Response:
    doc = await _body(request)
    if not isinstance(doc, dict) or "workers" not in doc:
        raise errors.BadRequest('expected {"workers": N}')
    return _json(await _manager(request).scale(_name(request), doc["workers"]))


async def delete_service(request: web.Request) -> web.Response:
    name = _name(request)
    await _manager(request).delete(name)
    return _json({"deleted": name})


async def status(request: web.Request) -> web.Response:
    state = request.app[GATEWAY_KEY].state
    return _json(
        {
            "gateway": {"version": __version__, "pid": os.getpid()},
            "uptime_s": round(time.monotonic() - state.started_at, 3),
            "shutting_down": state.shutting_down,
            "services": _manager(request).list(),
        }
    )


async def reload(request: web.Request) -> web.Response:
    reloader = request.app[GATEWAY_KEY].state.reload
    if reloader is None:
        raise errors.BadRequest("this gateway has no config file to reload")
    return _json(await reloader())


async def openapi(request: web.Request) -> web.Response:
    return _json(OPENAPI)


def create_admin_app(main: web.Application) -> web.Application:
    admin = main[GATEWAY_KEY].config.admin
    token = admin.token if admin is not None else None
    app = web.Application(middlewares=[gateway_middleware, _auth(token)], client_max_size=MAX_BODY)
    app[GATEWAY_KEY] = main[GATEWAY_KEY]  # the same parts as the main application's
    r = app.router
    r.add_get("/admin/services", list_services)
    r.add_post("/admin/services", create_service)
    r.add_get("/admin/services/{name}", get_service)
    r.add_put("/admin/services/{name}", update_service)
    r.add_delete("/admin/services/{name}", delete_service)
    r.add_post("/admin/services/{name}/scale", scale_service)
    r.add_get("/admin/status", status)
    r.add_post("/admin/reload", reload)
    r.add_get("/admin/openapi.json", openapi)
    add_queue_routes(app)
    return app


async def start_admin(main: web.Application) -> web.AppRunner | None:
    """Listen for the admin API when ``admin:`` is configured; the runner to clean up."""
    admin = main[GATEWAY_KEY].config.admin
    if admin is None:
        return None
    runner = web.AppRunner(create_admin_app(main), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, admin.host, admin.port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return runner


def admin_url(runner: web.AppRunner) -> str:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            host = str(addr[0])
            return f"http://{f'[{host}]' if ':' in host else host}:{addr[1]}"
    raise RuntimeError("the admin API is not listening")


__all__ = ["admin_url", "create_admin_app", "start_admin", "token_matches"]
