"""Triton's model control on the main listener: ``POST /v2/repository/models/<m>/load`` and
``.../unload``, over the service manager (gateway.manage).

They change what the gateway serves, so they need the admin token (``Authorization:
Bearer <token>``); without an ``admin.token`` in the config they are refused (403). Load
starts a model that was unloaded, or rolls a loaded one so its model file is read again
(the running version serves until the new one is ready); unload drains and stops it.
Neither is persisted: a restart serves what the config file and the admin API say. Errors
are ``{"error": ...}``, as Triton answers.
"""

from __future__ import annotations

from aiohttp import web

from gateway.config import SERVICE_NAME_RE
from gateway.core import errors
from gateway.fronts.admin.api import token_matches
from gateway.fronts.state import GATEWAY_KEY

PREFIX = "/v2/repository/models/{model}"


def authorize_model_control(app: web.Application, authorization: str | None, name: str) -> str:
    """The checks before a load or unload, over REST or gRPC: model control on (an admin
    token configured, else 403), that token presented (else 401), a valid model name (400)."""
    admin = app[GATEWAY_KEY].config.admin
    if admin is None or not admin.token:
        raise errors.Forbidden("model control is off: it needs admin.token in the gateway's config")
    if not token_matches(authorization, admin.token):
        raise errors.Unauthorized("invalid or missing admin token")
    if not SERVICE_NAME_RE.fullmatch(name):
        raise errors.InvalidServiceName("invalid model name")
    return name


def _authorize(request: web.Request) -> str:
    return authorize_model_control(
        request.app, request.headers.get("Authorization"), request.match_info["model"]
    )


async def load(request: web.Request) -> web.Response:
    name = _authorize(request)
    await request.app[GATEWAY_KEY].manager.load(name)
    return web.json_response({})


async def unload(request: web.Request) -> web.Response:
    name = _authorize(request)
    await request.app[GATEWAY_KEY].manager.unload(name)
    return web.json_response({})


def setup(app: web.Application) -> None:
    app.router.add_post(PREFIX + "/load", load)
    app.router.add_post(PREFIX + "/unload", unload)
