"""The live status of a running gateway, as one JSON-able snapshot.

Per service: its workers and their states, restarts, request rate, error rate, refused
calls (401, 403, 429) and the p50/p99 of the gateway's time per request over the last few
seconds, why it is not ready and its last failed call, and for queues and asynchronous
services each queue's depth, the records delivered but not yet committed and the lag
(records no consumer has taken yet); for the gateway, the calls naming no configured
service. The status page (``/status``), its live stream and ``eas-gateway status`` all show
this one snapshot. The same sampler feeds the last hour's history
(``gateway.observability.history``) the page's charts draw.

Rates and percentiles are windowed: a sampler copies the request counters and the
latency histogram (``gateway.observability.metrics``) once a second and keeps the last
``WINDOW_SAMPLES``; a snapshot compares the newest copy with the oldest. Percentiles are
estimated from the histogram's buckets by linear interpolation, as Prometheus's
``histogram_quantile`` does.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from gateway import __version__
from gateway.config import Config, ServiceConfig
from gateway.core.backend import ServiceBackend
from gateway.core.services import GatewayState, not_ready_reason, service_ready
from gateway.observability.history import HISTORY_INTERVAL_S, StatusHistory, Totals, quantile, read_totals
from gateway.observability.metrics import GatewayMetrics

SAMPLE_INTERVAL_S = 1.0
WINDOW_SAMPLES = 6  # rates over the last 5 s


class StatusSampler:
    """Keeps the last samples of the gateway's counters (see the module doc)."""

    def __init__(
        self,
        config: Config,
        metrics: GatewayMetrics,
        state: GatewayState,
        backends: Mapping[str, ServiceBackend],
        queues: Any,
        history_interval_s: float = HISTORY_INTERVAL_S,
    ) -> None:
        # The live objects the gateway runs with (the service manager changes ``backends``
        # and ``config.services`` in place), read at every sample and snapshot.
        self.config = config
        self.metrics = metrics
        self.state = state
        self.backends = backends
        self.queues = queues
        self.samples: deque[Totals] = deque(maxlen=WINDOW_SAMPLES)
        self.history = StatusHistory(metrics, history_interval_s)
        self._history_due = 0.0
        self.stopping = asyncio.Event()  # set at shutdown: the live streams end

    @property
    def services(self) -> list[str]:
        return [s.name for s in self.config.services]

    def sample(self) -> None:
        now = time.monotonic()
        self.samples.append(read_totals(self.metrics, self.services, now))
        if now >= self._history_due:
            self._history_due = now + self.history.interval_s
            self.record_history(now)

    def record_history(self, now: float) -> None:
        """Add the history's point for the interval ending ``now`` (monotonic)."""
        queues = _queue_snapshot(self.queues)
        gauges: dict[str, dict[str, Any]] = {}
        for svc in self.config.services:
            figures: dict[str, Any] = {}
            backend = self.backends.get(svc.name)
            if backend is not None:
                try:
                    workers = backend.snapshot()
                    figures["workers"] = len(workers)
                    figures["ready_workers"] = sum(1 for w in workers if w.get("state") == "ready")
                    figures["in_flight"] = sum(int(w.get("outstanding", 0) or 0) for w in workers)
                    figures["restarts"] = int(backend.restarts_total)
                except Exception:  # noqa: S110 - a backend being torn down: no figure this time
                    pass
            if svc.processor == "queue" or svc.async_:
                figures["queues"] = {
                    q: {"depth": queues[q]["length"], "lag": queues[q]["lag"]}
                    for q in (svc.name, f"{svc.name}/sink")
                    if q in queues
                }
            gauges[svc.name] = figures
        self.history.record(self.services, gauges, at=now, wall=time.time())

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def snapshot(self) -> dict[str, Any]:
        now = read_totals(self.metrics, self.services, time.monotonic())
        old = self.samples[0] if self.samples else now
        window = max(now.at - old.at, 1e-9)
        bounds = self.metrics.latency.bounds
        queues = _queue_snapshot(self.queues)
        state = self.state
        out = []
        for svc in self.config.services:
            name = svc.name
            done = now.requests[name] - old.requests.get(name, 0)
            failed = now.errors[name] - old.errors.get(name, 0)
            before = old.latency.get(name) or [0] * len(now.latency[name])
            buckets = [a - b for a, b in zip(now.latency[name], before, strict=True)]
            p50, p99 = quantile(0.5, bounds, buckets), quantile(0.99, bounds, buckets)
            queues_open = self.queues is not None
            ready = service_ready(self.backends, state, queues_open, name)
            entry: dict[str, Any] = {
                "name": name,
                "processor": svc.processor,
                "async": svc.async_,
                "ready": ready,
                "reason": None if ready else not_ready_reason(self.backends, state, queues_open, name),
                "last_error": _last_error(self.metrics.last_error.get(name)),
                "requests_total": now.requests[name],
                "errors_total": now.errors[name],
                "refused_total": now.refused[name],
                "rate_rps": round(done / window, 2) if old is not now else 0.0,
                "error_rate": round(failed / done, 4) if done else 0.0,
                "p50_ms": None if p50 is None else round(p50 * 1000, 3),
                "p99_ms": None if p99 is None else round(p99 * 1000, 3),
            }
            if svc.processor not in ("queue", "pipeline"):
                entry["placement"] = svc.placement
                entry["placement_reason"] = svc.placement_reason or None
            backend = self.backends.get(name)
            if backend is not None:
                entry["workers"] = [_worker(w) for w in backend.snapshot()]
                entry["restarts"] = int(backend.restarts_total)
            if svc.processor == "queue" or svc.async_:
                entry["queues"] = {q: queues[q] for q in (name, f"{name}/sink") if q in queues}
            if svc.versions:
                entry["versions"] = self._versions(svc)
            out.append(entry)
        return {
            "gateway": {"version": __version__},
            "uptime_s": round(time.monotonic() - state.started_at, 1),
            "window_s": round(window, 1),
            "shutting_down": state.shutting_down,
            # Calls naming no configured service (never labelled by the name they gave).
            "unknown_service_total": self.metrics.unknown_service.value,
            "services": out,
        }

    def _versions(self, svc: ServiceConfig) -> dict[str, dict[str, Any]]:
        """Per model version: its share of the calls that name none (the traffic split, or
        all to the latest), and the calls it answered and failed (5xx) since the start."""
        latest = svc.version_names[-1]
        share = dict(svc.traffic) if svc.traffic else {latest: 100}
        out = {
            v: {"traffic_percent": share.get(v, 0), "requests_total": 0, "errors_total": 0}
            for v in svc.version_names
        }
        for (name, version, status), n in self.metrics.versions.counts.items():
            figures = out.get(version) if name == svc.name else None
            if figures is not None:
                figures["requests_total"] += n
                if status >= 500:
                    figures["errors_total"] += n
        return out


def _last_error(error: tuple[float, int, str] | None) -> dict[str, Any] | None:
    if error is None:
        return None
    at, status, message = error
    return {"at": round(at, 3), "status": status, "message": message}


def _worker(w: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("id", "pid", "state", "outstanding", "restarts")
    return {k: w[k] for k in keys if k in w}


def _queue_snapshot(qm: Any) -> dict[str, dict[str, int]]:
    """queue -> depth (``length``), ``pending`` (delivered, not committed), ``consumers`` and
    ``lag`` (records waiting for a consumer: depth minus pending)."""
    if qm is None:
        return {}
    try:
        snap = qm.snapshot()
    except Exception:
        return {}
    queues = snap.get("queues", snap) if isinstance(snap, dict) else {}
    out: dict[str, dict[str, int]] = {}
    for name, figures in queues.items() if isinstance(queues, dict) else ():
        if not isinstance(figures, dict):
            continue
        length = int(figures.get("length", 0) or 0)
        pending = int(figures.get("pending", 0) or 0)
        out[str(name)] = {
            "length": length,
            "pending": pending,
            "consumers": int(figures.get("consumers", 0) or 0),
            "lag": max(0, length - pending),
        }
    return out


__all__ = ["StatusSampler", "quantile"]  # quantile: gateway.observability.history
