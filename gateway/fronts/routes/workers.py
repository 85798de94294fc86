"""Remote workers register here: ``GET /api/v1/workers/<service>`` (what to serve),
``POST /api/v1/workers/<service>`` (join; repeated as the heartbeat) and
``DELETE /api/v1/workers/<service>/<id>`` (leave), see gateway.backends.remote.

Authenticated with the service's ``remote_workers.token`` (raw or ``Bearer``), never a
client token. The body of a registration (repeated as the worker's heartbeat)::

    {"id": "...", "ipc": "tcp://10.0.0.7:9000", "http": "10.0.0.7:41234",
     "metadata": {"inputs": [...], "outputs": [...], "platform": "..."}}

answered ``{"registered": true|false, "ttl_s": ...}`` (false: a heartbeat of a known worker).
"""

from __future__ import annotations

import hmac
import json
import re
from typing import Any

from aiohttp import web

from gateway.codecs.ipc import TCP_PREFIX, split_tcp
from gateway.config import ServiceConfig
from gateway.core import errors
from gateway.core.backend import ServiceBackend
from gateway.core.groups import refuse_group
from gateway.core.metadata import ModelMetadata
from gateway.fronts.state import GATEWAY_KEY
from gateway.http.body import read_body
from gateway.manage.spec import spec_of

PREFIX = "/api/v1/workers"
MAX_REGISTRATION_BYTES = 256 * 1024
_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def _service(request: web.Request) -> tuple[ServiceConfig, ServiceBackend]:
    parts = request.app[GATEWAY_KEY]
    refuse_group(parts.dataplane.groups, request.match_info["service"], "takes no workers of its own")
    svc = parts.dataplane.find(request.match_info["service"])
    pool = parts.backends.get(svc.name)
    if svc.remote_workers is None or pool is None:
        raise errors.Forbidden(f"service {svc.name!r} does not take remote workers")
    auth = request.headers.get("Authorization", "")
    token = auth[7:] if auth[:7].lower() == "bearer " else auth
    if not token or not hmac.compare_digest(token.encode(), svc.remote_workers.token.encode()):
        raise errors.Unauthorized("a remote worker must present the service's worker token")
    if parts.config.gateway.worker_tls is not None and not _has_client_certificate(request):
        raise errors.Forbidden(
            "with gateway.worker_tls, a remote worker registers over HTTPS presenting a certificate "
            "the gateway's listener verifies (gateway.tls.client_ca_file)"
        )
    return svc, pool


def _has_client_certificate(request: web.Request) -> bool:
    """Whether the connection's client presented a certificate the listener verified (an
    unverified one never gets this far: the handshake refuses it)."""
    transport = request.transport
    return bool(transport is not None and transport.get_extra_info("peercert"))


def _host_port(value: Any, where: str) -> tuple[str, int]:
    if not isinstance(value, str):
        raise errors.BadRequest(f"{where}: expected 'host:port'")
    try:
        return split_tcp(TCP_PREFIX + value)
    except ValueError:
        raise errors.BadRequest(f"{where}: expected 'host:port', got {value[:64]!r}") from None


async def register(request: web.Request) -> web.Response:
    svc, pool = _service(request)
    gw = request.app[GATEWAY_KEY].config.gateway
    body = await read_body(request, MAX_REGISTRATION_BYTES, gw.body_timeout_s)
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise errors.BadRequest("the registration must be a JSON object") from None
    if not isinstance(raw, dict):
        raise errors.BadRequest("the registration must be a JSON object")
    worker_id = raw.get("id")
    if not isinstance(worker_id, str) or not _ID_RE.match(worker_id):
        raise errors.BadRequest("id: 1 to 128 letters, digits, '.', '_', ':' or '-'")
    ipc_host, ipc_port = _host_port(str(raw.get("ipc", "")).removeprefix(TCP_PREFIX), "ipc")
    http_host, http_port = _host_port(raw.get("http"), "http")
    metadata = None
    if raw.get("metadata") is not None:
        try:
            metadata = ModelMetadata.from_json(raw["metadata"])
        except (TypeError, ValueError) as exc:
            raise errors.BadRequest(f"metadata: {exc}") from None
    ipc = f"{TCP_PREFIX}{ipc_host}:{ipc_port}"
    new = pool.register_remote(worker_id, ipc, http_host, http_port, metadata)
    return web.json_response({"registered": new, "ttl_s": svc.remote_workers.ttl_s})


async def describe(request: web.Request) -> web.Response:
    """What a remote worker serves: the service's description as the gateway has it (client
    tokens included: the worker's own HTTP port checks them for direct calls)."""
    svc, _ = _service(request)
    spec = spec_of(svc, redact=False)
    spec.pop("remote_workers", None)
    return web.json_response({"service": spec, "ttl_s": svc.remote_workers.ttl_s})


async def deregister(request: web.Request) -> web.Response:
    _, pool = _service(request)
    if not pool.deregister_remote(request.match_info["id"]):
        raise errors.NotFound("no such remote worker")
    return web.json_response({"deregistered": True})


def setup(app: web.Application) -> None:
    app.router.add_get(PREFIX + "/{service}", describe)
    app.router.add_post(PREFIX + "/{service}", register)
    app.router.add_delete(PREFIX + "/{service}/{id}", deregister)


__all__ = ["PREFIX", "setup"]
