"""What the application shares with its routes: the aiohttp app keys, the queue manager's
contract as they use it (``QueueService``), and the readiness checks read through them
(gateway.core.services decides them).

Kept apart from ``gateway.app`` (which imports every route to mount it) so that routes,
the fast front and the CLI read the keys without importing the factory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from aiohttp import web

from gateway.config import Config, QueueConfig
from gateway.core import services
from gateway.core.backend import ServiceBackend
from gateway.core.dataplane import DataPlane
from gateway.core.services import GatewayState
from gateway.lean_http import FastRequest, Query, Reply
from gateway.observability.metrics import GatewayMetrics
from gateway.queue.dispatcher import DispatchHost
from gateway.queue.interfaces import QueueHost


class QueueService(QueueHost, DispatchHost, Protocol):
    """The queue manager (``gateway.queue.QueueManager``) as the application, the fronts and
    the CLI use it. The lean front also hands it to the queue's own handlers (``QueueHost``),
    and the application to the async dispatchers (``DispatchHost``: the queues served here,
    the dispatchers' registry, the callbacks run when the queues served here change)."""

    @property
    def configs(self) -> Mapping[str, QueueConfig]:
        """Every configured queue, whether this gateway serves it now or not."""
        ...

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def shutdown(self) -> None:
        """End long polls and watches, so that the gateway's stop is not held up by them."""
        ...

    def advertise(self, host: str, port: int) -> None:
        """Where other gateways sharing a Redis store forward this one's queue calls."""
        ...

    def has(self, name: str) -> bool: ...
    async def handle(self, request: web.Request, queue_name: str) -> web.StreamResponse: ...

    async def forward(self, queue_name: str, req: FastRequest, query: Query) -> Reply:
        """A plain call from the lean front for a queue another gateway serves."""
        ...

    def storage_failure(self) -> str | None:
        """Why a queue store refuses writes (its last write failed), or None."""
        ...

    def snapshot(self) -> dict[str, Any]: ...


CONFIG_KEY = web.AppKey("config", Config)
# Service name -> what runs it: worker pools, thread services, pipelines, older model versions.
BACKENDS_KEY = web.AppKey[dict[str, ServiceBackend]]("backends")
QUEUES_KEY = web.AppKey[QueueService | None]("queues")  # None: no queue is configured
METRICS_KEY = web.AppKey("metrics", GatewayMetrics)
STATE_KEY = web.AppKey("state", GatewayState)
# The protocol-neutral path from every entry point to the backends (gateway/core/dataplane.py).
DATAPLANE_KEY = web.AppKey("dataplane", DataPlane)


def _inputs(app: web.Application) -> tuple[dict[str, ServiceBackend], GatewayState, bool]:
    # An application a test builds with backends only has no run state: nothing has started.
    return app[BACKENDS_KEY], app.get(STATE_KEY) or GatewayState(), app.get(QUEUES_KEY) is not None


def service_ready(app: web.Application, name: str) -> bool:
    return services.service_ready(*_inputs(app), name)


def not_ready_reason(app: web.Application, name: str) -> str | None:
    return services.not_ready_reason(*_inputs(app), name)


def all_ready(app: web.Application) -> bool:
    state = app[STATE_KEY]
    if state.shutting_down or not state.started:
        return False
    return all(service_ready(app, s.name) for s in app[CONFIG_KEY].services)
