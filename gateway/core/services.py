"""The gateway's run state and whether a service takes calls, from the values that decide it.

Kept free of any web framework: the fronts, the status page and the service manager each
pass what they hold (the backends by name, the run state, whether the queue store is open).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.core.backend import ServiceBackend


@dataclass
class GatewayState:
    """Mutable run state shared by the fronts, the service manager and the CLI."""

    started_at: float = field(default_factory=time.monotonic)
    # Set by the CLI on SIGTERM/SIGINT: /readyz answers 503 from then on.
    shutting_down: bool = False
    # Pools and queues started (cleanup context entered).
    started: bool = False
    # Called after services were added, changed or removed at run time (gateway.manage).
    on_services_changed: list[Callable[[], None]] = field(default_factory=list)
    # Re-reads the config file and applies it (set by the CLI; SIGHUP and the admin API).
    reload: Callable[[], Awaitable[dict[str, Any]]] | None = None
    # Load each listener's TLS certificate and key again (SIGHUP; gateway.core.tls): the
    # connections already open keep theirs.
    tls_reloads: list[Callable[[], None]] = field(default_factory=list)


def backend_ready(backend: ServiceBackend) -> bool:
    """Whether a service's backend takes calls (a backend being torn down may fail to say:
    it does not)."""
    try:
        return backend.is_ready()
    except Exception:
        return False


def service_ready(
    backends: Mapping[str, ServiceBackend], state: GatewayState, queues_open: bool, name: str
) -> bool:
    backend = backends.get(name)
    if backend is not None:
        return backend_ready(backend)
    # Plain queue service: ready once the queue store is up.
    return state.started and queues_open


def not_ready_reason(
    backends: Mapping[str, ServiceBackend], state: GatewayState, queues_open: bool, name: str
) -> str | None:
    """Why a service takes no calls (a model that failed to load, workers starting, ...),
    as a client may read it; None when it is ready."""
    backend = backends.get(name)
    if backend is not None:
        try:
            return backend.not_ready_reason()
        except Exception:
            return "its state cannot be read"
    if service_ready(backends, state, queues_open, name):
        return None
    return "the queue store is not open"


__all__ = ["GatewayState", "backend_ready", "not_ready_reason", "service_ready"]
