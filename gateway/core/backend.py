"""What runs a service's calls, as every part of the gateway sees it.

Two contracts, one inside the other:

* :class:`Backend` is what the dataplane calls: ``dispatch``, whether the backend takes
  tensors as they are (``takes_tensors``) and the model's ``metadata``. A worker's compute
  queue offers this much, and so does every service backend.
* :class:`ServiceBackend` is a service of the gateway: a worker pool (remote workers join
  it), a ``placement: thread`` service, a pipeline. The application keeps one per service
  (older model versions included) and starts, stops, scales and watches it through this
  contract alone; status, metrics, readiness, discovery and the service manager read it.
  Every kind implements every member: one that has no such thing answers plainly (no
  direct-mode endpoints: an empty list; no workers to scale: a :class:`GatewayError`), so
  no caller has to ask whether a member is there.
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.config import ServiceConfig
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.core.metadata import ModelMetadata


class Backend(Protocol):
    """What the dataplane dispatches to (gateway.core.dataplane)."""

    @property
    def takes_tensors(self) -> bool:
        """Whether the V2 and gRPC adapters may hand their arrays over unencoded (a backend
        in the gateway process: ``DataPlane.tensors_call``); False: the TF wire form."""
        ...

    @property
    def metadata(self) -> ModelMetadata | None:
        """The model's inputs and outputs (the dataplane reads the output dtypes a model
        declares); None until the backend knows them (no worker has reported yet)."""
        ...

    async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        """Run one call; a refusal or a failure raises (``errors.from_exception`` maps it)."""
        ...


class ServiceBackend(Backend, Protocol):
    """One service's backend, in full (see the module docstring)."""

    # The service as last configured: the service manager swaps in a new description when a
    # change applies in place (the pending limit, the timeout, the worker count).
    service: ServiceConfig

    @property
    def restarts_total(self) -> int:
        """Workers restarted since the backend started (0 where nothing restarts)."""
        ...

    @property
    def pending(self) -> int:
        """Calls dispatched and not answered yet."""
        ...

    # --- lifecycle
    async def start(self) -> None:
        """Begin loading and return at once; ``wait_ready`` waits for it."""
        ...

    async def stop(self, drain_timeout: float) -> None:
        """Take no more calls, let those in flight finish (bounded), then release everything.
        Stopping twice is harmless."""
        ...

    async def wait_ready(self, timeout: float) -> bool:
        """True once the backend takes calls; False after ``timeout``, or earlier when it
        cannot become ready by itself (every worker failed to load)."""
        ...

    async def wait_all_ready(self, timeout: float) -> bool:
        """True once every worker is ready; False after ``timeout`` or as soon as one failed
        to start (a new version that does not load must not replace a working one)."""
        ...

    async def scale(self, workers: int, drain_timeout: float) -> None:
        """Run ``workers`` workers: new ones start in the background, surplus ones leave
        routing at once and stop once drained. A backend without workers of its own raises
        a :class:`GatewayError` saying so."""
        ...

    # --- readiness
    def is_ready(self) -> bool:
        """Whether a call dispatched now can run."""
        ...

    def not_ready_reason(self) -> str | None:
        """Why not, as a client may read it (a model that failed to load, workers starting);
        None while ready."""
        ...

    # --- figures
    def snapshot(self) -> list[dict[str, Any]]:
        """One entry per worker (a process, a session, a pipeline step's worker): ``id``,
        ``pid``, ``state``, ``outstanding``, ``restarts`` and what else the kind knows."""
        ...

    def ready_endpoints(self) -> list[tuple[str, int]]:
        """(host, port) of each ready worker's own HTTP port, for direct-mode clients; empty
        where the calls run in the gateway itself."""
        ...

    # --- remote workers (gateway.backends.remote)
    def register_remote(
        self, worker_id: str, ipc: str, http_host: str, http_port: int, metadata: ModelMetadata | None
    ) -> bool:
        """A remote worker's registration or heartbeat; True when it is new. A backend that
        takes none raises a :class:`GatewayError`."""
        ...

    def deregister_remote(self, worker_id: str) -> bool:
        """A remote worker leaving cleanly; False when it is unknown."""
        ...


__all__ = ["Backend", "ServiceBackend"]
