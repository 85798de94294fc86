"""The admin API: the service manager over HTTP, on its own listener and token.

Configured by ``admin: {host, port, token}`` (off without it; a non-loopback host needs a
token). Every call carries ``Authorization: Bearer <token>`` (or the bare token) when a
token is set. Bodies are service descriptions in JSON or YAML, the schema of the config
file's ``services:`` entries; answers are JSON, errors the gateway's
``{"code", "message", "request_id"}``. A body the call cannot use (not JSON or YAML, not a
service description, a body on a call that takes none) and a config file that does not load
(``POST /admin/reload``) are 400, with the message saying what is wrong. The OpenAPI
description is at ``/admin/openapi.json``.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

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


def no_body(handler: Handler) -> Handler:
    """A call that takes no body refuses one, rather than leave the caller believing it was read."""

    async def checked(request: web.Request) -> web.StreamResponse:
        if request.body_exists and (await request.read()).strip():
            raise errors.BadRequest(f"{request.method} {request.path} takes no body")
        return await handler(request)

    return checked


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


async def set_traffic(request: web.Request) -> web.Response:
    """``{"traffic": {"1": 90, "2": 10}}`` (or the mapping alone): the service's new split."""
    doc = await _body(request)
    if isinstance(doc, dict) and set(doc) == {"traffic"}:
        doc = doc["traffic"]
    if not isinstance(doc, dict):
        raise errors.BadRequest('expected {"traffic": {"<version>": <percent>, ...}}')
    return _json(await _manager(request).set_traffic(_name(request), doc))


async def start_canary(request: web.Request) -> web.Response:
    """``{"version": 2, "steps": [5, 25, 50, 100], "interval_s": "60s"}``: 202, the canary
    under way in the service's description."""
    return _json(await _manager(request).canary(_name(request), await _body(request)), 202)


async def abort_canary(request: web.Request) -> web.Response:
    return _json(await _manager(request).abort_canary(_name(request)))


async def delete_service(request: web.Request) -> web.Response:
    name = _name(request)
    await _manager(request).delete(name)
    return _json({"deleted": name})


# The snapshot the status page shows (gateway.observability.status), as the admin app reads it.
SnapshotFn = Callable[[], dict[str, Any]]
SNAPSHOT_KEY = web.AppKey("status_snapshot", SnapshotFn)


async def status(request: web.Request) -> web.Response:
    """The status page's snapshot (what ``eas-gateway status`` prints, from here or from the main
    port), with the gateway's pid and each not-ready service's reason."""
    doc = request.app[SNAPSHOT_KEY]()
    doc["gateway"]["pid"] = os.getpid()
    described = {s["name"]: s for s in _manager(request).list()}
    for svc in doc["services"]:
        live = described.get(svc["name"], {})
        for key in ("reason", "in_flight"):
            if key in live:
                svc.setdefault(key, live[key])
    return _json(doc)


async def reload(request: web.Request) -> web.Response:
    reloader = request.app[GATEWAY_KEY].state.reload
    if reloader is None:
        raise errors.BadRequest("this gateway has no config file to reload")
    try:
        return _json(await reloader())
    except ConfigError as exc:  # the file does not load: the message SIGHUP logs
        raise errors.BadRequest(str(exc)) from None


async def openapi(request: web.Request) -> web.Response:
    return _json(OPENAPI)


def create_admin_app(main: web.Application, snapshot: SnapshotFn) -> web.Application:
    """The admin application over ``main``'s parts; ``snapshot``: the status page's snapshot."""
    admin = main[GATEWAY_KEY].config.admin
    token = admin.token if admin is not None else None
    app = web.Application(middlewares=[gateway_middleware, _auth(token)], client_max_size=MAX_BODY)
    app[GATEWAY_KEY] = main[GATEWAY_KEY]  # the same parts as the main application's
    app[SNAPSHOT_KEY] = snapshot
    r = app.router
    r.add_get("/admin/services", no_body(list_services))
    r.add_post("/admin/services", create_service)
    r.add_get("/admin/services/{name}", no_body(get_service))
    r.add_put("/admin/services/{name}", update_service)
    r.add_delete("/admin/services/{name}", no_body(delete_service))
    r.add_post("/admin/services/{name}/scale", scale_service)
    r.add_put("/admin/services/{name}/traffic", set_traffic)
    r.add_post("/admin/services/{name}/canary", start_canary)
    r.add_delete("/admin/services/{name}/canary", no_body(abort_canary))
    r.add_get("/admin/status", no_body(status))
    r.add_post("/admin/reload", no_body(reload))
    r.add_get("/admin/openapi.json", no_body(openapi))
    add_queue_routes(app, no_body)
    return app


async def start_admin(
    main: web.Application, snapshot: SnapshotFn, ssl_context: ssl.SSLContext | None = None
) -> web.AppRunner | None:
    """Listen for the admin API when ``admin:`` is configured (over TLS with ``ssl_context``:
    the HTTP port's, gateway.tls); the runner to clean up."""
    admin = main[GATEWAY_KEY].config.admin
    if admin is None:
        return None
    runner = web.AppRunner(create_admin_app(main, snapshot), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, admin.host, admin.port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return runner


def admin_url(runner: web.AppRunner, tls: bool = False) -> str:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            host = str(addr[0])
            return f"{'https' if tls else 'http'}://{f'[{host}]' if ':' in host else host}:{addr[1]}"
    raise RuntimeError("the admin API is not listening")


__all__ = ["SNAPSHOT_KEY", "admin_url", "create_admin_app", "no_body", "start_admin", "token_matches"]
