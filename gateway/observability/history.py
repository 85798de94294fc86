"""The last hour of the status page's figures, kept on the server.

Every ``interval_s`` the status sampler (``gateway.observability.status``) hands this ring
buffer what it reads of the gateway at that moment: the request counters, the latency
histograms, the calls per model version and the unknown-service counter (cumulative, from
``gateway.observability.metrics``), and the gauges (workers, ready workers, restarts, calls
in flight, queue depth and lag). A point holds the figures of one interval: rates per second
from the difference with the previous reading, p50/p99 from the difference of the
histograms, gauges as read. ``span_s`` of points are kept (an hour by default): a page opened
late, during an incident, draws what happened before it was opened.

``to_json`` gives the points column by column (one list per figure, ``None`` where a
service did not exist yet), the form a chart library draws without reshaping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.observability.metrics import GatewayMetrics

HISTORY_INTERVAL_S = 5.0
HISTORY_SPAN_S = 3600.0
# Statuses counted as refused: no or wrong credentials, forbidden, over a limit.
REFUSED = frozenset({401, 403, 429})

# The figures of a service in a point, in the order the JSON lists them.
SERVICE_FIELDS = (
    "rate_rps",
    "errors_rps",
    "refused_rps",
    "p50_ms",
    "p99_ms",
    "workers",
    "ready_workers",
    "restarts",
    "in_flight",
)
VERSION_FIELDS = ("rate_rps", "errors_rps", "p99_ms")
QUEUE_FIELDS = ("depth", "lag")


@dataclass(frozen=True)
class Totals:
    """Cumulative counters read at one moment (monotonic ``at``)."""

    at: float
    requests: dict[str, int]
    errors: dict[str, int]
    refused: dict[str, int]
    latency: dict[str, list[int]]
    version_calls: dict[tuple[str, str], tuple[int, int]]  # (calls, errors >= 500)
    version_latency: dict[tuple[str, str], list[int]]
    unknown: int


def read_totals(metrics: GatewayMetrics, services: Sequence[str], at: float) -> Totals:
    requests = dict.fromkeys(services, 0)
    errors = dict.fromkeys(services, 0)
    refused = dict.fromkeys(services, 0)
    for (service, status), n in list(metrics.requests.counts.items()):
        if service in requests:
            requests[service] += n
            if status >= 500:
                errors[service] += n
            elif status in REFUSED:
                refused[service] += n
    calls: dict[tuple[str, str], tuple[int, int]] = {}
    for (service, version, status), n in list(metrics.versions.counts.items()):
        total, failed = calls.get((service, version), (0, 0))
        calls[(service, version)] = (total + n, failed + (n if status >= 500 else 0))
    return Totals(
        at,
        requests,
        errors,
        refused,
        {s: metrics.latency.counts(s) for s in services},
        calls,
        {k: list(v) for k, v in metrics.versions.seconds.counts.items()},
        metrics.unknown_service.value,
    )


def quantile(q: float, bounds: Sequence[float], counts: Sequence[int]) -> float | None:
    """The ``q`` quantile of a histogram (per-bucket counts, the last bucket unbounded),
    interpolated within its bucket as Prometheus's ``histogram_quantile`` does."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            low = bounds[i - 1] if i > 0 else 0.0
            if i >= len(bounds):  # beyond the last bound: all that is known is "more than"
                return bounds[-1]
            return low + (bounds[i] - low) * ((rank - seen) / n)
        seen += n
    return bounds[-1]


def _ms(q: float, bounds: Sequence[float], now: Sequence[int], before: Sequence[int] | None) -> float | None:
    counts = [a - b for a, b in zip(now, before, strict=True)] if before else now
    value = quantile(q, bounds, counts)
    return None if value is None else round(value * 1000, 3)


def _rate(n: int, seconds: float) -> float:
    return round(max(0, n) / seconds, 3)


class StatusHistory:
    """The ring buffer (see the module doc). Fed on the event loop by the status sampler."""

    def __init__(
        self, metrics: GatewayMetrics, interval_s: float = HISTORY_INTERVAL_S, span_s: float = HISTORY_SPAN_S
    ) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self.span_s = span_s
        self.points: deque[dict[str, Any]] = deque(maxlen=max(1, int(span_s / interval_s)))
        self._last: Totals | None = None

    def record(
        self,
        services: Sequence[str],
        gauges: Mapping[str, Mapping[str, Any]],
        *,
        at: float,
        wall: float,
    ) -> None:
        """Add the point for the interval that ends now (``at``: monotonic, ``wall``: the
        clock the page shows). ``gauges``: service -> its ``workers``, ``ready_workers``,
        ``restarts``, ``in_flight`` and ``queues`` ({queue: {depth, lag}}) as read now. The
        first call only takes the reading the next point is measured from."""
        now = read_totals(self.metrics, services, at)
        last, self._last = self._last, now
        if last is None:
            return
        seconds = max(now.at - last.at, 1e-9)
        bounds = self.metrics.latency.bounds
        out: dict[str, dict[str, Any]] = {}
        for name in services:
            entry: dict[str, Any] = {
                "rate_rps": _rate(now.requests[name] - last.requests.get(name, 0), seconds),
                "errors_rps": _rate(now.errors[name] - last.errors.get(name, 0), seconds),
                "refused_rps": _rate(now.refused[name] - last.refused.get(name, 0), seconds),
                "p50_ms": _ms(0.5, bounds, now.latency[name], last.latency.get(name)),
                "p99_ms": _ms(0.99, bounds, now.latency[name], last.latency.get(name)),
            }
            figures = gauges.get(name, {})
            for key in ("workers", "ready_workers", "restarts", "in_flight"):
                entry[key] = figures.get(key)
            queues = figures.get("queues", {})
            entry["queues"] = {q: {k: f.get(k) for k in QUEUE_FIELDS} for q, f in queues.items()}
            entry["versions"] = {}
            out[name] = entry
        for (service, version), (calls, failed) in now.version_calls.items():
            entry = out.get(service)
            if entry is None:
                continue
            calls0, failed0 = last.version_calls.get((service, version), (0, 0))
            entry["versions"][version] = {
                "rate_rps": _rate(calls - calls0, seconds),
                "errors_rps": _rate(failed - failed0, seconds),
                "p99_ms": _ms(
                    0.99,
                    bounds,
                    now.version_latency[(service, version)],
                    last.version_latency.get((service, version)),
                ),
            }
        self.points.append(
            {"t": round(wall, 3), "unknown_rps": _rate(now.unknown - last.unknown, seconds), "services": out}
        )

    def to_json(self, since: float | None = None) -> dict[str, Any]:
        """The points after ``since`` (wall-clock seconds; all when None), column by column::

        {"interval_s", "span_s", "t": [...], "unknown_rps": [...], "services": {name: {
            "rate_rps": [...], ..., "versions": {v: {field: [...]}}, "queues": {q: {field: [...]}}}}}
        """
        points = [p for p in self.points if since is None or p["t"] > since]
        services: dict[str, dict[str, Any]] = {}
        n = len(points)
        for i, point in enumerate(points):
            for name, entry in point["services"].items():
                cols = services.get(name)
                if cols is None:
                    cols = services[name] = {f: [None] * n for f in SERVICE_FIELDS}
                    cols["versions"], cols["queues"] = {}, {}
                for f in SERVICE_FIELDS:
                    cols[f][i] = entry.get(f)
                for nested, fields in (("versions", VERSION_FIELDS), ("queues", QUEUE_FIELDS)):
                    for key, figures in entry[nested].items():
                        sub = cols[nested].get(key)
                        if sub is None:
                            sub = cols[nested][key] = {f: [None] * n for f in fields}
                        for f in fields:
                            sub[f][i] = figures.get(f)
        return {
            "interval_s": self.interval_s,
            "span_s": self.span_s,
            "t": [p["t"] for p in points],
            "unknown_rps": [p["unknown_rps"] for p in points],
            "services": services,
        }


__all__ = [
    "HISTORY_INTERVAL_S",
    "HISTORY_SPAN_S",
    "REFUSED",
    "StatusHistory",
    "Totals",
    "quantile",
    "read_totals",
]
