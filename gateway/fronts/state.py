"""What the application shares with its routes: the aiohttp app keys and the readiness
checks read through them (gateway.core.services decides them).

Kept apart from ``gateway.app`` (which imports every route to mount it) so that routes,
the fast front and the async dispatcher read the keys without importing the factory.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.config import Config
from gateway.core import services
from gateway.core.dataplane import DataPlane
from gateway.core.services import GatewayState
from gateway.observability.metrics import GatewayMetrics

CONFIG_KEY = web.AppKey("config", Config)
POOLS_KEY = web.AppKey("pools", dict)  # service name -> WorkerPool
QUEUES_KEY = web.AppKey("queues", object)  # QueueManager | None
METRICS_KEY = web.AppKey("metrics", GatewayMetrics)
STATE_KEY = web.AppKey("state", GatewayState)
# The protocol-neutral path from every entry point to the pools (gateway/core/dataplane.py).
DATAPLANE_KEY = web.AppKey("dataplane", DataPlane)


def _inputs(app: web.Application) -> tuple[dict[str, Any], GatewayState, bool]:
    # An application a test builds with pools only has no run state: nothing has started.
    return app[POOLS_KEY], app.get(STATE_KEY) or GatewayState(), app.get(QUEUES_KEY) is not None


def service_ready(app: web.Application, name: str) -> bool:
    return services.service_ready(*_inputs(app), name)


def not_ready_reason(app: web.Application, name: str) -> str | None:
    return services.not_ready_reason(*_inputs(app), name)


def all_ready(app: web.Application) -> bool:
    state = app[STATE_KEY]
    if state.shutting_down or not state.started:
        return False
    return all(service_ready(app, s.name) for s in app[CONFIG_KEY].services)
