"""Service discovery for direct (VPC) mode: the ready workers of one service.

``GET /api/v1/servicediscovery/upstreams/<svc>`` (Python client 0.34+) and the
legacy ``/exported/apis/eas.alibaba-inc.k8s.io/v1/upstreams/<svc>`` (SDK-GO,
old Python) answer ``{"endpoints": {"items": [{"ip", "port", "weight"}]}}``.
Weights are integers (a float breaks the reference client's gcd). Open by
default, since the reference client sends no token here; with
``gateway.discovery_requires_token`` the service's token is required.
Queue, async and pipeline services, and services whose model runs in the gateway's
threads (``placement: thread``), are served by the gateway itself, so their only
endpoint is the gateway's own address.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from eas_sdk._core.constants import DISCOVERY_PATH_PREFIX, LEGACY_DISCOVERY_PATH_PREFIX
from gateway.core.groups import refuse_group
from gateway.fronts.routes import raw_tail, split_service
from gateway.fronts.state import GATEWAY_KEY

WEIGHT = 100


def _handler(prefix: str) -> Any:
    async def upstreams(request: web.Request) -> web.Response:
        parts = request.app[GATEWAY_KEY]
        config = parts.config
        plane = parts.dataplane
        name, _ = split_service(raw_tail(request, prefix))
        # A group has no workers of its own: the gateway draws each call's member.
        refuse_group(plane.groups, name, "has no workers of its own to call in direct mode")
        svc = plane.find(name)
        if config.gateway.discovery_requires_token:
            # A discovery call has no body to sign: only a raw token can pass.
            plane.authorize(svc, request.headers, request.rel_url.raw_path)
        items: list[dict[str, Any]] = []
        pool = parts.backends.get(svc.name)
        # Queue, async, pipeline and placement: thread services run in the gateway itself:
        # their direct endpoint is the gateway's own address (no hop to skip).
        if pool is not None and not svc.async_ and svc.pipeline is None and svc.placement != "thread":
            for host, port in pool.ready_endpoints():
                items.append({"ip": str(host), "port": int(port), "weight": WEIGHT})
        else:
            sock = request.transport.get_extra_info("sockname") if request.transport else None
            if sock:
                items.append({"ip": str(sock[0]), "port": int(sock[1]), "weight": WEIGHT})
        return web.json_response({"endpoints": {"items": items}})

    return upstreams


def setup(app: web.Application) -> None:
    for prefix in (DISCOVERY_PATH_PREFIX, LEGACY_DISCOVERY_PATH_PREFIX):
        app.router.add_get(prefix + r"{tail:[\s\S]*}", _handler(prefix))
