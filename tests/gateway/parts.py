"""The composition root for applications a test builds route by route."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from gateway.config import Config, ServiceConfig
from gateway.core.backend import ServiceBackend
from gateway.core.dataplane import DataPlane
from gateway.core.services import GatewayState
from gateway.manage.manager import GatewayParts
from gateway.observability.metrics import GatewayMetrics


def gateway_parts(
    config: Config,
    backends: dict[str, ServiceBackend] | None = None,
    *,
    served: Sequence[ServiceConfig] | None = None,
    started: bool = False,
) -> GatewayParts:
    """``served``: the services the dataplane routes (the config's, unless older versions
    are served beside them)."""
    backends = {} if backends is None else backends
    plane = DataPlane(list(config.services if served is None else served), backends)
    metrics = GatewayMetrics(CollectorRegistry(), [s.name for s in config.services])
    return GatewayParts(config, plane, backends, None, metrics, GatewayState(started=started))
