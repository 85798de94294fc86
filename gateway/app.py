"""Application factory: config in, aiohttp Application out.

Worker pools (one per predict service) and the queue manager (only when a
queue or async service is configured; imported lazily) are started and
stopped by cleanup contexts, so ``create_app`` itself does no I/O. Factories
are injectable so the front can be tested with in-process fakes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway.backends.sourced import with_model_sources
from gateway.config import Config, GatewayConfig, ServiceConfig
from gateway.config.versions import version_services
from gateway.core import parse_pool
from gateway.core.admission import Admission, AdmissionLimits
from gateway.core.auth import SignaturePolicy, replay_cache
from gateway.core.backend import ServiceBackend
from gateway.core.calls import WorkerRequest
from gateway.core.dataplane import DataPlane
from gateway.core.services import GatewayState
from gateway.core.tracing import require_tracing
from gateway.fronts.state import GATEWAY_KEY
from gateway.http.middleware import gateway_middleware
from gateway.manage.autoscale import Autoscaler
from gateway.manage.manager import GatewayParts, ServiceManager
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.payloads import PayloadLog
from gateway.queue.interfaces import QueueService

if TYPE_CHECKING:  # imported on use: only a gateway with pipelines loads them
    from gateway.backends.pipelines.backend import PipelineBackend

LINGERING_S = 2.0

PoolFactory = Callable[[ServiceConfig, GatewayConfig], ServiceBackend]
QueueFactory = Callable[[Config], QueueService]


def predict_services(config: Config) -> list[ServiceConfig]:
    """Services served by a worker pool (everything but plain queues; async ones too)."""
    return [s for s in config.services if s.processor != "queue"]


def older_versions(config: Config) -> list[ServiceConfig]:
    """The services behind the older model versions of versioned services, one pool each
    (a service's own pool serves its latest version)."""
    return [v for s in predict_services(config) for v in version_services(s).values() if v is not s]


def queue_services(config: Config) -> list[ServiceConfig]:
    return [s for s in config.services if s.processor == "queue" or s.async_]


def _default_pool_factory(service: ServiceConfig, gateway: GatewayConfig) -> ServiceBackend:
    """Worker processes, or ONNX Runtime sessions in the gateway's threads (``placement: thread``)."""
    if service.placement == "thread":
        from gateway.backends.threads import ThreadService

        return ThreadService(service, gateway)
    from gateway.backends.pool import WorkerPool

    return WorkerPool(service, gateway)


def _default_queue_factory(config: Config) -> QueueService:
    from gateway.queue import QueueManager

    return QueueManager(config)


def create_app(
    config: Config,
    *,
    pool_factory: PoolFactory | None = None,
    queue_factory: QueueFactory | None = None,
    worker_request: Callable[..., Any] | None = None,
    registry: CollectorRegistry | None = None,
    cluster_serving: bool = False,
    managed_store: Any = None,
) -> web.Application:
    """Build the application. ``cluster_serving`` also mounts the Cluster Serving REST
    routes (``/api/cluster-serving/<svc>/predict``, ``/predict``); the CLI turns it on."""
    gw = config.gateway
    app = web.Application(
        middlewares=[gateway_middleware],
        # aiohttp enforces this while reading (chunked bodies included); the predict
        # route also checks Content-Length before reading.
        client_max_size=gw.max_body_bytes,
        handler_args={
            "keepalive_timeout": gw.keepalive_timeout_s,
            # Never gunzip request bodies (a small compressed body could inflate past the size
            # limit unchecked): a Content-Encoding gets 415 instead.
            "auto_decompress": False,
            # After an early answer (401/404/413/...) the unread body is drained for at most
            # this long before the connection closes: closing with unread data sends a TCP RST,
            # which can destroy the answer before the client reads it.
            "lingering_time": LINGERING_S,
        },
    )
    registry = registry or CollectorRegistry(auto_describe=True)
    metrics = GatewayMetrics(registry, [s.name for s in config.services])
    # A model named by a URL is fetched before its backend starts (gateway.backends.sourced).
    make_pool = with_model_sources(pool_factory or _default_pool_factory)
    older = older_versions(config)
    backends: dict[str, ServiceBackend] = {
        s.name: make_pool(s, gw) for s in [*predict_services(config), *older] if s.pipeline is None
    }
    pipelines: dict[str, PipelineBackend] = {}
    if any(s.pipeline is not None for s in config.services):
        # Pipelines go after the pools they call, so they start after them and reach them.
        from gateway.backends.pipelines.backend import pipeline_backends
        from gateway.backends.pipelines.timings import StepTimings

        timings = StepTimings(registry)
        pipelines = pipeline_backends(list(config.services), gw, backends, make_pool, timings)
        backends.update(pipelines)
    qm: QueueService | None = None
    if queue_services(config):
        qm = (queue_factory or _default_queue_factory)(config)
    # A sample of the calls of services with a payload_log, written as CloudEvents to their sinks.
    payloads = PayloadLog(registry, gw.payload_log_buffer, lambda: qm.queues if qm is not None else None)
    plane_kw: dict[str, Any] = {}
    if gw.trace_endpoint is not None:
        # Spans around the dataplane's steps (the tracing extra); without it, the plain one.
        require_tracing()
        from gateway.observability.tracing import TracedAdmission, TracedDataPlane, Tracing

        plane_cls: type[DataPlane] = TracedDataPlane
        plane_kw["tracing"] = tracing = Tracing(gw)
        admission = TracedAdmission(AdmissionLimits.of(gw), tracing)
        app.on_cleanup.append(lambda _app: asyncio.to_thread(tracing.shutdown))
    else:
        plane_cls = DataPlane
        admission = Admission(AdmissionLimits.of(gw))
    plane = plane_cls(
        [*config.services, *older],
        backends,
        make_request=worker_request or WorkerRequest,
        observer=metrics,
        admission=admission,
        max_response_bytes=gw.max_response_bytes,
        signature=SignaturePolicy.of(gw),
        replay=replay_cache(gw),
        payloads=payloads,
        **plane_kw,
    )
    for pipeline in pipelines.values():  # their model steps call other services through it
        pipeline.attach(plane)
    metrics.attach(lambda: backends, lambda: qm)
    metrics.attach_admission(plane.admission)

    # The composition root every front reads; services created, updated, scaled and deleted
    # at run time (the admin API, SIGHUP) change it in place through its manager.
    parts = GatewayParts(config, plane, backends, qm, metrics, GatewayState())
    parts.manager = ServiceManager(parts, make_pool, managed_store)
    app[GATEWAY_KEY] = parts

    from gateway.fronts.routes import (
        admin,
        discovery,
        kserve,
        openapi,
        paddle,
        predict,
        repository,
        status,
        workers,
    )

    admin.setup(app)
    openapi.setup(app)
    status.setup(app)
    repository.setup(app)
    discovery.setup(app)
    workers.setup(app)
    predict.setup(app)
    kserve.setup(app)
    paddle.setup(app)
    if cluster_serving:
        from gateway.fronts.routes import cluster_serving as cluster_serving_routes

        cluster_serving_routes.setup(app)
    app.cleanup_ctx.append(_lifecycle)
    # After _lifecycle: autoscaling starts once the pools have, and stops before they do.
    app.cleanup_ctx.append(_autoscaling)
    # After _lifecycle: the payload log writes what it holds before the queue store closes.
    app.cleanup_ctx.append(_payload_log(payloads))
    if gw.grpc_port:
        # After _lifecycle: gRPC listens once the pools start and stops before they do.
        from gateway.fronts.grpc.server import grpc_lifecycle

        app.cleanup_ctx.append(grpc_lifecycle)
    if any(s.rpc_port for s in config.services):
        # Paddle's pipeline gRPC service on each service's own port, started as gRPC's is.
        from gateway.fronts.grpc.paddle_pipeline import paddle_pipeline_lifecycle

        app.cleanup_ctx.append(paddle_pipeline_lifecycle)
    if qm is not None:
        app.on_shutdown.append(_end_queue_streams)
    if any(s.async_ for s in config.services):
        # Dispatchers feed async services' input queues to their pools; registered after
        # _lifecycle so they start after pools/queues and stop before them.
        from gateway.queue import dispatcher

        app.cleanup_ctx.append(dispatcher.dispatchers(config, qm, backends, plane))
    if any(s.cluster_serving is not None for s in config.services):
        # Cluster Serving's own Redis stream, read like the dispatchers read their queues.
        from gateway.fronts import cluster_serving_redis

        cluster_serving_redis.setup(app)
    return app


def _payload_log(payloads: PayloadLog) -> Any:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        yield
        await payloads.aclose(app[GATEWAY_KEY].config.gateway.shutdown_timeout_s)

    return ctx


async def _end_queue_streams(app: web.Application) -> None:
    """Answer pending long polls and close watches (1001) so SIGTERM is not held up by them:
    aiohttp waits for open handlers before it runs the cleanup contexts."""
    qm = app[GATEWAY_KEY].queues
    if qm is not None:
        await qm.shutdown()


async def _autoscaling(app: web.Application) -> AsyncIterator[None]:
    """Autoscaled services' worker counts follow their load (gateway.manage.autoscale)."""
    scaler = Autoscaler(app[GATEWAY_KEY].manager)
    scaler.start()
    yield
    await scaler.stop()


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    """Start queues and backends (they return at once; workers boot in the background)."""
    parts = app[GATEWAY_KEY]
    backends, qm, gw = parts.backends, parts.queues, parts.config.gateway
    started: list[ServiceBackend] = []
    try:
        if qm is not None:
            await qm.start()
        for backend in backends.values():
            await backend.start()
            started.append(backend)
    except BaseException:
        for backend in started:
            await backend.stop(0.0)
        if qm is not None:
            await qm.stop()
        raise
    parts.state.started = True
    yield
    parts.state.shutting_down = True
    # Backends drain in parallel; the queue store closes last (async services feed it).
    # The backends served now (services changed at run time included) and any the service
    # manager is still starting or draining; stopping one twice is harmless.
    current = {id(b): b for b in (*started, *backends.values(), *parts.manager.started)}
    await asyncio.gather(*(p.stop(gw.shutdown_timeout_s) for p in current.values()), return_exceptions=True)
    if qm is not None:
        await qm.stop()
    await asyncio.to_thread(parse_pool.shutdown)
