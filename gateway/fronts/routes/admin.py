"""Operations endpoints: liveness, readiness, the service listing and Prometheus metrics."""

from __future__ import annotations

import os
import time
from typing import Any

from aiohttp import web

from gateway import __version__
from gateway.core.errors import ServiceNotFound
from gateway.fronts.state import GATEWAY_KEY, all_ready, not_ready_reason, service_ready
from gateway.observability.metrics import CONTENT_TYPE


async def healthz(request: web.Request) -> web.Response:
    # Liveness: the event loop answers. Never depends on workers: a service whose model
    # cannot load must not get the whole gateway restarted, so this stays 200.
    return web.json_response({"status": "ok"})


def _storage_failure(app: web.Application, name: str | None = None) -> str | None:
    """Why the queue store refuses writes (its last write failed: disk full, read-only), for
    the whole gateway or for service ``name`` if it has a queue; None while it writes."""
    qm = app[GATEWAY_KEY].queues
    if qm is None or (name is not None and not qm.has(name)):
        return None
    return qm.storage_failure()


async def readyz(request: web.Request) -> web.Response:
    app = request.app
    parts = app[GATEWAY_KEY]
    name = request.query.get("service")
    if name is not None:
        if parts.config.service(name) is None:
            raise ServiceNotFound(f"service {name!r} not found")
        storage = _storage_failure(app, name)
        ok = not parts.state.shutting_down and parts.state.started and service_ready(app, name)
        ok = ok and not storage
        doc: dict[str, Any] = {"ready": ok, "service": name}
        reason = storage or (None if ok else not_ready_reason(app, name))
        if reason:
            doc["reason"] = reason
        return web.json_response(doc, status=200 if ok else 503)
    storage = _storage_failure(app)
    ok = all_ready(app) and not storage
    body: dict[str, Any] = {"ready": ok}
    if storage:
        body["storage"] = storage
    if parts.state.shutting_down:
        body["shutting_down"] = True
    else:
        names = [s.name for s in parts.config.services]
        body["services"] = {n: service_ready(app, n) for n in names}
        # Why each service that is not ready is not (a model that failed to load, ...).
        reasons = {n: r for n, ok_ in body["services"].items() if not ok_ and (r := not_ready_reason(app, n))}
        if reasons:
            body["reasons"] = reasons
    return web.json_response(body, status=200 if ok else 503)


def _queue_figures(snapshot: Any, names: list[str]) -> dict[str, Any]:
    queues = snapshot.get("queues", snapshot) if isinstance(snapshot, dict) else {}
    if not isinstance(queues, dict):
        return {}
    return {n: queues[n] for n in names if n in queues}


async def services(request: web.Request) -> web.Response:
    app = request.app
    parts = app[GATEWAY_KEY]
    backends = parts.backends
    qm = parts.queues
    qsnap: Any = None
    if qm is not None:
        try:
            qsnap = qm.snapshot()
        except Exception:
            qsnap = None
    out = []
    for svc in parts.config.services:
        entry: dict[str, Any] = {
            "name": svc.name,
            "processor": svc.processor,
            "async": svc.async_,
            "auth": bool(svc.tokens),
            "timeout_ms": svc.timeout_ms,
            "max_pending": svc.max_pending,
            "ready": service_ready(app, svc.name),
        }
        reason = None if entry["ready"] else not_ready_reason(app, svc.name)
        if reason:
            entry["reason"] = reason
        backend = backends.get(svc.name)
        if backend is not None:
            entry["workers"] = backend.snapshot()
            entry["restarts"] = backend.restarts_total
        if qsnap is not None and (svc.processor == "queue" or svc.async_):
            entry["queues"] = _queue_figures(qsnap, [svc.name, f"{svc.name}/sink"])
            dispatchers = qsnap.get("dispatchers") if isinstance(qsnap, dict) else None
            if isinstance(dispatchers, dict) and svc.name in dispatchers:
                entry["dispatcher"] = dispatchers[svc.name]
        out.append(entry)
    state = parts.state
    return web.json_response(
        {
            "gateway": {"version": __version__, "pid": os.getpid()},
            "services": out,
            "uptime_s": round(time.monotonic() - state.started_at, 3),
            "shutting_down": state.shutting_down,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    """Prometheus' text by default; Cluster Serving's JSON list of timers to a client that
    asks for JSON (``Accept: application/json``), as its ``/metrics`` answers."""
    gw_metrics = request.app[GATEWAY_KEY].metrics
    if "application/json" in request.headers.get("Accept", ""):
        return web.Response(body=gw_metrics.render_json(), content_type="application/json")
    return web.Response(body=gw_metrics.render(), headers={"Content-Type": CONTENT_TYPE})


def setup(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz, allow_head=True)
    app.router.add_get("/readyz", readyz, allow_head=True)
    app.router.add_get("/api/services", services)
    app.router.add_get("/metrics", metrics)
