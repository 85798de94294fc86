"""What the application shares with its routes: the aiohttp app keys, the run state and
the readiness checks built on them.

Kept apart from ``gateway.app`` (which imports every route to mount it) so that routes,
the fast front and the async dispatcher read the keys without importing the factory.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gateway.config import Config
from gateway.dataplane import DataPlane
from gateway.metrics import GatewayMetrics


@dataclass
class GatewayState:
    """Mutable run state shared by routes and the CLI."""

    started_at: float = field(default_factory=time.monotonic)
    # Set by the CLI on SIGTERM/SIGINT: /readyz answers 503 from then on.
    shutting_down: bool = False
    # Pools and queues started (cleanup context entered).
    started: bool = False
    # Called after services were added, changed or removed at run time (gateway.manage).
    on_services_changed: list[Callable[[], None]] = field(default_factory=list)
    # Re-reads the config file and applies it (set by the CLI; SIGHUP and the admin API).
    reload: Callable[[], Awaitable[dict[str, Any]]] | None = None


CONFIG_KEY = web.AppKey("config", Config)
POOLS_KEY = web.AppKey("pools", dict)  # service name -> WorkerPool
QUEUES_KEY = web.AppKey("queues", object)  # QueueManager | None
METRICS_KEY = web.AppKey("metrics", GatewayMetrics)
STATE_KEY = web.AppKey("state", GatewayState)
# The protocol-neutral path from every entry point to the pools (gateway/dataplane.py).
DATAPLANE_KEY = web.AppKey("dataplane", DataPlane)


def backend_ready(pool: Any) -> bool:
    """Whether a service's backend takes calls: one that runs in the gateway (a pipeline, a
    ``placement: thread`` service) knows itself; a worker pool has a ready worker."""
    is_ready = getattr(pool, "is_ready", None)
    try:
        return bool(is_ready()) if callable(is_ready) else bool(pool.ready_endpoints())
    except Exception:
        return False


def service_ready(app: web.Application, name: str) -> bool:
    pool = app[POOLS_KEY].get(name)
    if pool is not None:
        return backend_ready(pool)
    # Plain queue service: ready once the queue store is up.
    return app[STATE_KEY].started and app[QUEUES_KEY] is not None


def not_ready_reason(app: web.Application, name: str) -> str | None:
    """Why a service takes no calls (a model that failed to load, workers starting, ...),
    as a client may read it; None when it is ready."""
    pool = app[POOLS_KEY].get(name)
    if pool is not None:
        reason = getattr(pool, "not_ready_reason", None)
        if callable(reason):
            try:
                return reason()  # type: ignore[no-any-return]
            except Exception:
                return "its state cannot be read"
        return None if service_ready(app, name) else "it has no ready worker"
    if service_ready(app, name):
        return None
    return "the queue store is not open"


def all_ready(app: web.Application) -> bool:
    state = app[STATE_KEY]
    if state.shutting_down or not state.started:
        return False
    return all(service_ready(app, s.name) for s in app[CONFIG_KEY].services)
