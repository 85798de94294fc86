"""A service whose model is named by a URL: the model is fetched first, then its backend starts.

The gateway fetches the model once (gateway.sources: into the download cache, reused while
the object is unchanged) and hands the backend it wraps (a worker pool, a ``placement:
thread`` service) the local file, so every worker of the service, and every restart of one,
loads the same file without a download of its own. Until the file is there the service is
not ready, and its reason says how far the download is; a fetch that fails is the reason,
naming the URL (without credentials) and what the store said. A new fetch happens when the
service starts again: a restart, a rolling update, a Triton repository ``load``.

At start, the gateway announces itself after ``worker_start_timeout_s`` even while a model
still downloads (``wait_ready`` is bounded as a pool's). A rolling update (``wait_all_ready``)
waits for the download whatever it takes, bounded by the store's own connect and read
timeouts, and gives the new workers ``worker_start_timeout_s`` from when the file is on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gateway.config import GatewayConfig, ServiceConfig
from gateway.config.model_urls import is_model_url, redact_url
from gateway.core import errors
from gateway.core.backend import ServiceBackend
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.core.metadata import ModelMetadata
from gateway.sources import FetchCancelled, FetchError, Progress, fetch_model

log = logging.getLogger("gateway.pool")

Factory = Callable[[ServiceConfig, GatewayConfig], ServiceBackend]


def cache_dir(gateway: GatewayConfig) -> str:
    """Where fetched models are kept: ``model_cache_dir``, or ``models`` in the data directory."""
    return gateway.model_cache_dir or os.path.join(gateway.data_dir, "models")


def fetches_model(service: ServiceConfig) -> bool:
    """A service whose model the gateway fetches: named by a URL, with workers of its own (a
    service served only by remote workers has its model on their hosts)."""
    return is_model_url(service.model) and not (service.workers == 0 and service.remote_workers is not None)


def with_model_sources(factory: Factory) -> Factory:
    """``factory``'s backends, each wrapped in a :class:`SourcedBackend` where its model is a URL."""

    def make(service: ServiceConfig, gateway: GatewayConfig) -> ServiceBackend:
        inner = factory(service, gateway)
        return SourcedBackend(inner, service, gateway) if fetches_model(service) else inner

    return make


class SourcedBackend:
    """A ``ServiceBackend`` (gateway.core.backend) in full: the model fetched, then ``inner``."""

    def __init__(self, inner: ServiceBackend, service: ServiceConfig, gateway: GatewayConfig) -> None:
        assert service.model is not None
        self._inner = inner
        self._service = service
        self.gateway = gateway
        self._url = service.model
        self._progress = Progress(redact_url(service.model))
        self._local: str | None = None
        self._error: str | None = None
        self._started = False  # the inner backend
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._done: asyncio.Event | None = None
        self._cancel = threading.Event()

    # --- the service, as configured and as the inner backend runs it ---------------------

    @property
    def service(self) -> ServiceConfig:
        return self._service

    @service.setter
    def service(self, svc: ServiceConfig) -> None:
        self._service = svc
        self._inner.service = self._local_service(svc)

    def _local_service(self, svc: ServiceConfig) -> ServiceConfig:
        return svc if self._local is None else replace(svc, model=self._local)

    @property
    def takes_tensors(self) -> bool:
        return self._inner.takes_tensors

    @property
    def metadata(self) -> ModelMetadata | None:
        return self._inner.metadata

    @property
    def restarts_total(self) -> int:
        return self._inner.restarts_total

    @property
    def pending(self) -> int:
        return self._inner.pending

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Begin fetching the model and return at once; the inner backend starts after it."""
        if self._task is not None:
            return
        self._done = asyncio.Event()
        self._task = asyncio.create_task(self._fetch_then_start(), name=f"fetch-{self._service.name}")

    async def _fetch_then_start(self) -> None:
        assert self._done is not None
        name = self._service.name
        try:
            fetched = await asyncio.to_thread(
                fetch_model,
                self._url,
                self.gateway.model_sources,
                cache_dir(self.gateway),
                self._progress,
                self._cancel,
            )
        except FetchCancelled:
            return
        except FetchError as exc:
            self._error = str(exc)
            log.error("service %s: %s", name, self._error)
            return
        except Exception as exc:  # a failure of the fetch's own, reported as the reason
            self._error = f"cannot fetch model {self._progress.url}: {exc}"
            log.exception("service %s: %s", name, self._error)
            return
        else:
            if self._stopping:
                return
            self._local = str(fetched.path)
            self._inner.service = self._local_service(self._service)
            await self._inner.start()
            self._started = True
        finally:
            self._done.set()

    async def stop(self, drain_timeout: float) -> None:
        self._stopping = True
        self._cancel.set()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._started:
            await self._inner.stop(drain_timeout)

    async def _fetched(self, timeout: float | None = None) -> bool:
        """Wait for the fetch (at most ``timeout``; None: until it ends, see the module
        docstring); whether the model is here."""
        if self._done is None:
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._done.wait(), timeout)
        return self._started

    async def wait_ready(self, timeout: float) -> bool:
        """Bounded as a worker pool's: the gateway's start announces itself after ``timeout``
        even while a large model still downloads (the reason says how far it is)."""
        deadline = time.monotonic() + timeout
        if not await self._fetched(timeout):
            return False
        return await self._inner.wait_ready(max(0.0, deadline - time.monotonic()))

    async def wait_all_ready(self, timeout: float) -> bool:
        return await self._fetched() and await self._inner.wait_all_ready(timeout)

    async def scale(self, workers: int, drain_timeout: float) -> None:
        """Before the inner backend runs, the new count is in the service it will start with."""
        if self._started:
            await self._inner.scale(workers, drain_timeout)

    # --- readiness and calls -------------------------------------------------------------

    def is_ready(self) -> bool:
        return self._started and self._inner.is_ready()

    def not_ready_reason(self) -> str | None:
        if self._error is not None:
            return self._error
        if not self._started:
            return self._progress.text()
        return self._inner.not_ready_reason()

    async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        if not self._started:
            raise errors.ServiceNotReady(
                f"service {self._service.name} is not ready: {self.not_ready_reason()}",
                retry_after_s=1 if self._error is None else 5,
            )
        return await self._inner.dispatch(req, timeout)

    # --- figures -------------------------------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        return self._inner.snapshot() if self._started else []

    def ready_endpoints(self) -> list[tuple[str, int]]:
        return self._inner.ready_endpoints() if self._started else []

    def register_remote(
        self, worker_id: str, ipc: str, http_host: str, http_port: int, metadata: ModelMetadata | None
    ) -> bool:
        if not self._started:
            raise errors.ServiceNotReady(
                f"service {self._service.name} is not ready: {self.not_ready_reason()}", retry_after_s=1
            )
        return self._inner.register_remote(worker_id, ipc, http_host, http_port, metadata)

    def deregister_remote(self, worker_id: str) -> bool:
        return self._inner.deregister_remote(worker_id) if self._started else False


__all__ = ["SourcedBackend", "cache_dir", "fetches_model", "with_model_sources"]
