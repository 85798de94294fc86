"""What the application shares with its fronts: the composition root (``GatewayParts``,
under one typed key) and the readiness checks read through it (gateway.core.services
decides them).

Kept apart from ``gateway.app`` (which imports every route to mount it) so that routes,
the fast front and the CLI reach the root without importing the factory.
"""

from __future__ import annotations

from aiohttp import web

from gateway.core import services
from gateway.core.backend import ServiceBackend
from gateway.core.services import GatewayState
from gateway.manage.manager import GatewayParts
from gateway.queue.interfaces import QueueService

__all__ = [
    "GATEWAY_KEY",
    "GatewayParts",
    "QueueService",
    "all_ready",
    "gateway_of",
    "not_ready_reason",
    "service_ready",
]


# The one thing the application shares with its fronts: every route, the lean front, the
# gRPC servicer and the admin app read the gateway's parts through it.
GATEWAY_KEY = web.AppKey("gateway", GatewayParts)


def gateway_of(app: web.Application) -> GatewayParts:
    return app[GATEWAY_KEY]


def _inputs(app: web.Application) -> tuple[dict[str, ServiceBackend], GatewayState, bool]:
    gw = app[GATEWAY_KEY]
    return gw.backends, gw.state, gw.queues is not None


def service_ready(app: web.Application, name: str) -> bool:
    return services.service_ready(*_inputs(app), name)


def not_ready_reason(app: web.Application, name: str) -> str | None:
    return services.not_ready_reason(*_inputs(app), name)


def all_ready(app: web.Application) -> bool:
    gw = app[GATEWAY_KEY]
    if gw.state.shutting_down or not gw.state.started:
        return False
    return all(service_ready(app, s.name) for s in gw.config.services)
