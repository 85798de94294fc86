"""The base of the tests' service backends: a ``ServiceBackend`` (gateway.core.backend) in
full, so a double stands wherever a worker pool does. A double scripts what its test looks at
(``dispatch``, readiness, metadata, its workers) and inherits plain answers for the rest:
ready while ``ready`` is set, nothing restarted or pending, no direct-mode endpoints, no
workers to scale, no remote workers. tests/gateway/test_backend_contract.py checks every
double against the contract."""

from __future__ import annotations

from typing import Any

from gateway.backends.in_gateway import RunsInGateway
from gateway.config import ServiceConfig
from gateway.core import errors
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.core.metadata import ModelMetadata


def double_service(name: str = "double") -> ServiceConfig:
    """A service description for a double whose test does not look at it."""
    return ServiceConfig(name=name, processor="python")


class BackendDouble(RunsInGateway):
    # Each double gives its own ``service`` (a dataclass double: as a field; a class-level
    # default here would become the default of a dataclass field of that name).
    service: ServiceConfig
    takes_tensors: bool = False
    metadata: ModelMetadata | None = None
    restarts_total: int = 0
    pending: int = 0
    ready: bool = True

    async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        return WorkerResponse(200, bytes(req.body), req.content_type)

    async def start(self) -> None:
        pass

    async def stop(self, drain_timeout: float) -> None:
        pass

    async def wait_ready(self, timeout: float) -> bool:
        return self.is_ready()

    async def wait_all_ready(self, timeout: float) -> bool:
        return self.is_ready()

    async def scale(self, workers: int, drain_timeout: float) -> None:
        raise errors.BadRequest(f"service {self.service.name!r} is a test double: it has no workers")

    def is_ready(self) -> bool:
        return self.ready

    def not_ready_reason(self) -> str | None:
        return None if self.is_ready() else "it has no ready worker"

    def snapshot(self) -> list[dict[str, Any]]:
        return []


__all__ = ["BackendDouble", "double_service"]
