"""What the backends whose calls run in the gateway process share (a ``placement: thread``
service, a pipeline): none of their work has an address of its own, so they offer no
direct-mode endpoints and take no remote workers. Their ``ServiceBackend`` members for
these say so plainly instead of being left out."""

from __future__ import annotations

from gateway.config import ServiceConfig
from gateway.core import errors
from gateway.core.metadata import ModelMetadata


class RunsInGateway:
    service: ServiceConfig

    def ready_endpoints(self) -> list[tuple[str, int]]:
        """No direct mode: the calls run in the gateway, so a direct-mode client calls it
        (discovery lists the gateway's own address)."""
        return []

    def register_remote(
        self, worker_id: str, ipc: str, http_host: str, http_port: int, metadata: ModelMetadata | None
    ) -> bool:
        """Refused: a remote worker joins a worker pool (the config allows them only there)."""
        raise errors.Forbidden(f"service {self.service.name!r} does not take remote workers")

    def deregister_remote(self, worker_id: str) -> bool:
        return False  # none ever joined


__all__ = ["RunsInGateway"]
