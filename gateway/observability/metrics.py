"""Prometheus metrics of the gateway, on an injected CollectorRegistry.

Labels only ever take configured service names (plus ``status`` codes), so a
flood of bogus service names cannot grow the payload: unknown names are
counted in one unlabelled counter. Worker figures (restarts, pending, ready)
and queue figures are read from the backends/queue manager at scrape time.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import itertools
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, GCCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gateway.config import ServiceConfig
from gateway.core import errors
from gateway.core.backend import ServiceBackend
from gateway.core.histograms import LabelledBuckets
from gateway.observability.timers import Timer, Timers

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _PoolCollector(Collector):
    """Reads per-service worker and queue figures when /metrics is scraped."""

    def __init__(
        self, backends: Callable[[], Mapping[str, ServiceBackend]], queues: Callable[[], Any]
    ) -> None:
        self._backends = backends
        self._queues = queues

    def collect(self) -> Iterable[Metric]:
        restarts = CounterMetricFamily(
            "easgw_worker_restarts", "Worker processes restarted by the supervisor", labels=["service"]
        )
        pending = GaugeMetricFamily(
            "easgw_pending_requests", "Requests sent to workers, not yet answered", labels=["service"]
        )
        ready = GaugeMetricFamily("easgw_ready_workers", "Workers ready to take requests", labels=["service"])
        workers = GaugeMetricFamily("easgw_workers", "Configured worker processes", labels=["service"])
        for name, backend in self._backends().items():
            try:
                snap = backend.snapshot()
                restarts.add_metric([name], float(backend.restarts_total))
                pending.add_metric([name], float(sum(int(w.get("outstanding", 0)) for w in snap)))
                # By state, not by endpoints: sessions in the gateway's threads have none.
                ready.add_metric([name], float(sum(1 for w in snap if w.get("state") == "ready")))
                workers.add_metric([name], float(len(snap)))
            except Exception:  # noqa: S112 - a backend being torn down must not break the scrape
                continue
        yield from (restarts, pending, ready, workers)
        qm = self._queues()
        if qm is None:
            return
        try:
            snap = qm.snapshot()
        except Exception:
            return
        queues = snap.get("queues", snap) if isinstance(snap, dict) else {}
        length = GaugeMetricFamily("easgw_queue_length", "Items held by a queue", labels=["queue"])
        consumers = GaugeMetricFamily(
            "easgw_queue_consumers", "Watchers connected to a queue (all groups)", labels=["queue"]
        )
        pending = GaugeMetricFamily(
            "easgw_queue_pending", "Records delivered to a watcher and not yet committed", labels=["queue"]
        )
        held = GaugeMetricFamily("easgw_queue_bytes", "Payload bytes held by a queue", labels=["queue"])
        cached = GaugeMetricFamily(
            "easgw_queue_memory_bytes", "Payload bytes of a queue in memory", labels=["queue"]
        )
        found = False
        if isinstance(queues, dict):
            for qname, figures in queues.items():
                if not isinstance(figures, dict):
                    continue
                value = figures.get("length", figures.get("size"))
                if isinstance(value, (int, float)):
                    length.add_metric([str(qname)], float(value))
                    found = True
                for family, key in (
                    (consumers, "consumers"),
                    (pending, "pending"),
                    (held, "bytes"),
                    (cached, "memory_bytes"),
                ):
                    value = figures.get(key)
                    if isinstance(value, (int, float)):
                        family.add_metric([str(qname)], float(value))
        if found:
            yield from (length, consumers, pending, held, cached)
        dispatchers = snap.get("dispatchers") if isinstance(snap, dict) else None
        if isinstance(dispatchers, dict) and dispatchers:
            yield from _dispatcher_families(dispatchers)


# Asynchronous services' dispatcher figures (Dispatcher.snapshot()): name, key, help.
_DISPATCHER_COUNTERS = (
    ("easgw_async_results", "results_total", "Results written to the sink (errors included)"),
    ("easgw_async_errors", "errors_total", "Results with an error status (>= 400)"),
    ("easgw_async_empty", "empty_total", "Replies with an empty body (200): no result written"),
    ("easgw_async_retries", "retries_total", "Worker calls retried (overload, dead connection, timeout)"),
    ("easgw_async_sink_full_waits", "sink_full_waits", "Times the dispatcher waited for room in the sink"),
    ("easgw_async_ready_waits", "ready_waits", "Times the dispatcher waited for a ready worker"),
)


def _dispatcher_families(dispatchers: Mapping[str, Any]) -> Iterable[Metric]:
    counters = [
        (CounterMetricFamily(name, doc, labels=["service"]), key) for name, key, doc in _DISPATCHER_COUNTERS
    ]
    inflight = GaugeMetricFamily(
        "easgw_async_inflight",
        "Input records the dispatcher holds: taken, at a worker or being written",
        labels=["service"],
    )
    for service, figures in dispatchers.items():
        if not isinstance(figures, dict):
            continue
        for family, key in counters:
            value = figures.get(key)
            if isinstance(value, (int, float)):
                family.add_metric([str(service)], float(value))
        value = figures.get("inflight")
        if isinstance(value, (int, float)):
            inflight.add_metric([str(service)], float(value))
    yield from (family for family, _ in counters)
    yield inflight


class _ServiceHistogram(Collector):
    """A histogram labelled by service, kept as plain per-service bucket counts.

    Observed on the event loop only, so an observation is a bisect and two additions,
    without prometheus_client's lock per bucket and sum; exposed at scrape time as a
    regular histogram (``_bucket``/``_count``/``_sum``).
    """

    def __init__(self, name: str, doc: str, services: Iterable[str], registry: CollectorRegistry) -> None:
        self.name = name
        self.doc = doc
        self._bounds = list(_LATENCY_BUCKETS)
        self._les = [floatToGoString(b) for b in (*_LATENCY_BUCKETS, math.inf)]
        # Every configured service shows up from the start.
        self._counts = {s: [0] * len(self._les) for s in services}
        self._sums = dict.fromkeys(self._counts, 0.0)
        registry.register(self)

    def add(self, service: str) -> None:
        self._counts.setdefault(service, [0] * len(self._les))
        self._sums.setdefault(service, 0.0)

    def sum_of(self, service: str) -> float:
        return self._sums.get(service, 0.0)

    def observe(self, service: str, value: float) -> None:
        counts = self._counts.get(service)
        if counts is None:
            return
        counts[bisect.bisect_left(self._bounds, value)] += 1  # "le" buckets: value <= bound
        self._sums[service] += value

    @property
    def bounds(self) -> list[float]:
        """The buckets' upper bounds (the last bucket, +Inf, is not listed)."""
        return list(self._bounds)

    def counts(self, service: str) -> list[int]:
        """A copy of ``service``'s per-bucket counts (not cumulative); empty if unknown."""
        return list(self._counts.get(service, ()))

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=["service"])
        for service, counts in self._counts.items():
            buckets = list(zip(self._les, itertools.accumulate(counts), strict=True))
            family.add_metric([service], buckets, self._sums[service])
        yield family


class _RequestCounts(Collector):
    """``easgw_requests_total{service, status}`` as plain per-(service, status) counts:
    incremented on the event loop without prometheus_client's lock and call chain per request,
    exposed at scrape time as a regular counter."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counts: dict[tuple[str, int], int] = {}
        registry.register(self)

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "easgw_requests",
            "Predict/queue requests by service and HTTP status",
            labels=["service", "status"],
        )
        for (service, status), n in sorted(self.counts.items()):
            family.add_metric([service, str(status)], float(n))
        yield family


class _VersionCalls(Collector):
    """Calls dispatched to each version of a service's model, by status, and their dispatch
    time: ``easgw_version_requests_total{service, version, status}`` and
    ``easgw_version_dispatch_seconds{service, version}``. Kept as plain counts on the event
    loop, exposed at scrape time. Label values come from the configuration only."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counts: dict[tuple[str, str, int], int] = {}
        self.seconds = LabelledBuckets(_LATENCY_BUCKETS)  # by (service, version)
        registry.register(self)

    def observe(self, service: str, version: str, status: int, seconds: float) -> None:
        key = (service, version, status)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.seconds.observe((service, version), seconds)

    @property
    def bounds(self) -> list[float]:
        """The dispatch time histogram's upper bounds (seconds; one more bucket is unbounded)."""
        return self.seconds.bounds

    def figures(self, service: str, version: str) -> tuple[int, int, list[int]]:
        """(calls, calls not answered with success (4xx and 5xx: a processor that raises
        answers 400), dispatch time per bucket) of one version so far: two of them apart make
        a window's figures."""
        calls = failed = 0
        for (name, v, status), n in self.counts.items():
            if name == service and v == version:
                calls += n
                failed += n if status >= 400 else 0
        return calls, failed, list(self.seconds.counts.get((service, version), [0] * len(self.seconds.les)))

    def collect(self) -> Iterable[Metric]:
        requests = CounterMetricFamily(
            "easgw_version_requests",
            "Calls dispatched to a version of a service's model, by status",
            labels=["service", "version", "status"],
        )
        for (service, version, status), n in sorted(self.counts.items()):
            requests.add_metric([service, version, str(status)], float(n))
        yield requests
        yield self.seconds.family(
            "easgw_version_dispatch_seconds",
            "Time from dispatch to a version's answer (the worker's queue and compute included)",
            ("service", "version"),
        )


class _MirrorCalls(Collector):
    """Copies of calls sent to services' mirrors (gateway.core.mirror), apart from the calls
    themselves: ``easgw_mirror_requests_total{service, mirror, outcome}`` (the status the
    mirror answered, or ``shed``: not sent, too many in flight), their dispatch time
    ``easgw_mirror_dispatch_seconds{service, mirror}`` and ``easgw_mirror_in_flight{service}``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counts: dict[tuple[str, str, str], int] = {}
        self.in_flight: dict[str, int] = {}
        self.seconds = LabelledBuckets(_LATENCY_BUCKETS)  # by (service, mirror)
        registry.register(self)

    def observe(self, service: str, mirror: str, outcome: str | None, seconds: float, in_flight: int) -> None:
        self.in_flight[service] = in_flight
        if outcome is None:  # a copy left: only the count in flight changes
            return
        key = (service, mirror, outcome)
        self.counts[key] = self.counts.get(key, 0) + 1
        if outcome != "shed":
            self.seconds.observe((service, mirror), seconds)

    def collect(self) -> Iterable[Metric]:
        requests = CounterMetricFamily(
            "easgw_mirror_requests",
            "Copies of a service's calls sent to its mirror, by outcome (the status, or shed: not sent)",
            labels=["service", "mirror", "outcome"],
        )
        for (service, mirror, outcome), n in sorted(self.counts.items()):
            requests.add_metric([service, mirror, outcome], float(n))
        yield requests
        yield self.seconds.family(
            "easgw_mirror_dispatch_seconds",
            "Time from sending a copy to its mirror to the mirror's answer",
            ("service", "mirror"),
        )
        running = GaugeMetricFamily(
            "easgw_mirror_in_flight",
            "Copies of a service's calls its mirror is running now",
            labels=["service"],
        )
        for service, n in sorted(self.in_flight.items()):
            running.add_metric([service], float(n))
        yield running


class _Count(Collector):
    """A counter without labels, kept as a plain integer (event loop only), read at scrape time."""

    def __init__(self, name: str, doc: str, registry: CollectorRegistry) -> None:
        self.name = name
        self.doc = doc
        self.value = 0
        registry.register(self)

    def inc(self, n: int = 1) -> None:
        self.value += n

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily(self.name, self.doc, value=float(self.value))


def _processor_error(body: bytes) -> str:
    return errors.message_of(bytes(body[:2048]))[:300]


def version_of(svc: ServiceConfig) -> tuple[str, str]:
    """(service, version) of the service a call ran on: an older version's ``name@version``,
    or the service itself, which serves its latest."""
    name, _, version = svc.name.partition("@")
    return name, version or svc.version_names[-1]


class _Inflight:
    """The in-flight gauge as a plain counter (event loop only), read at scrape time:
    no lock per request."""

    __slots__ = ("value",)

    def __init__(self, gauge: Gauge) -> None:
        self.value = 0
        gauge.set_function(lambda: self.value)

    def inc(self) -> None:
        self.value += 1

    def dec(self) -> None:
        self.value -= 1


class _AdmissionCollector(Collector):
    """The admission figures (gateway/core/admission.py): what is held now, the limits, refusals."""

    def __init__(self, admission: Any) -> None:
        self._admission = admission

    def collect(self) -> Iterable[Metric]:
        snap = self._admission.snapshot()
        yield GaugeMetricFamily("easgw_connections", "Open client connections", value=snap["connections"])
        yield GaugeMetricFamily(
            "easgw_buffered_request_bytes", "Bytes held by request bodies being received",
            value=snap["buffered_bytes"],
        )  # fmt: skip
        yield GaugeMetricFamily(
            "easgw_unverified_request_bytes",
            "Bytes held by bodies of calls not yet authenticated (EAS signature)",
            value=snap["unverified_bytes"],
        )
        inflight = GaugeMetricFamily(
            "easgw_service_inflight", "Calls dispatched to a service, not yet answered", labels=["service"]
        )
        for service, n in sorted(snap["inflight"].items()):
            inflight.add_metric([service], float(n))
        yield inflight
        limits = GaugeMetricFamily("easgw_limit", "Configured admission limits (0: off)", labels=["limit"])
        for name, value in sorted(snap["limits"].items()):
            limits.add_metric([name], float(value))
        yield limits
        refused = CounterMetricFamily(
            "easgw_admission_refused", "Connections or requests refused by a limit", labels=["reason"]
        )
        for reason in ("connections", "buffered_bytes", "unverified_bytes", "inflight"):
            refused.add_metric([reason], float(snap["refused"].get(reason, 0)))
        yield refused


class _LoopCollector(Collector):
    """Tasks alive on the event loop that renders the scrape: a count that only grows is a
    leak (a task per call or per connection never reaped)."""

    def collect(self) -> Iterable[Metric]:
        try:
            tasks = len(asyncio.all_tasks())
        except RuntimeError:  # rendered outside a running loop: nothing to count
            return
        yield GaugeMetricFamily("easgw_asyncio_tasks", "Tasks alive on the gateway's event loop", value=tasks)


class _FrozenCollector(Collector):
    """Objects the start-up left out of the garbage collector's full scans (gateway.core.heap):
    0 until the gateway is ready."""

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            "python_gc_frozen_objects",
            "Objects frozen out of the cyclic garbage collector's scans once the gateway was ready",
            value=gc.get_freeze_count(),
        )


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry, service_names: Iterable[str]) -> None:
        self.registry = registry
        # Resident memory, open file descriptors and CPU time of the gateway process; its
        # garbage collector's runs per generation, and what it leaves out of them.
        ProcessCollector(registry=registry)
        GCCollector(registry=registry)
        registry.register(_FrozenCollector())
        registry.register(_LoopCollector())
        self.services = frozenset(service_names)
        self.requests = _RequestCounts(registry)
        self.latency = _ServiceHistogram(
            "easgw_request_duration_seconds",
            "Gateway time per request, from routing to the last response byte handed to aiohttp",
            self.services,
            registry,
        )
        self.queue_time = _ServiceHistogram(
            "easgw_queue_time_seconds",
            "Time a request spent waiting and in transit (dispatch time minus worker compute time)",
            self.services,
            registry,
        )
        self.compute_time = _ServiceHistogram(
            "easgw_compute_seconds", "Worker compute time reported by the worker", self.services, registry
        )
        self.unknown_service = _Count(
            "easgw_unknown_service_requests",
            "Requests naming a service that is not configured or not a valid name (never labelled)",
            registry,
        )
        self.versions = _VersionCalls(registry)
        self.mirrors = _MirrorCalls(registry)
        # Service -> its last failed call: (wall-clock time, status, message), for the status page.
        self.last_error: dict[str, tuple[float, int, str]] = {}
        self.inflight = _Inflight(
            Gauge("easgw_inflight_requests", "Requests being handled", registry=registry)
        )
        # The same calls as Cluster Serving's JSON timers (GET /metrics, Accept: application/json).
        self.timers = Timers()
        # Service -> its request, compute and queue timers, kept so a call formats no name.
        self._timers_of: dict[str, tuple[Timer, Timer, Timer]] = {}
        # What one call updates, found with one look-up (see observe and observe_dispatch).
        self._request_of: dict[str, tuple[list[int], Timer]] = {}
        self._dispatch_of: dict[int, _DispatchTargets] = {}
        for name in self.services:
            self.timers.add(_timer(name, "request"))

    def add_service(self, name: str) -> None:
        """Label a service added at run time (the service manager; names pass its validation)."""
        self.services = self.services | {name}
        for hist in (self.latency, self.queue_time, self.compute_time):
            hist.add(name)
        self.timers.add(_timer(name, "request"))

    def totals(self, service: str) -> tuple[int, float]:
        """Requests answered for ``service`` and their summed gateway time in seconds."""
        count = sum(n for (svc, _), n in self.requests.counts.items() if svc == service)
        return count, self.latency.sum_of(service)

    def attach(self, backends: Callable[[], Mapping[str, ServiceBackend]], queues: Callable[[], Any]) -> None:
        self.registry.register(_PoolCollector(backends, queues))

    def attach_admission(self, admission: Any) -> None:
        self.registry.register(_AdmissionCollector(admission))

    # Every call updates a request counter, histograms and Cluster Serving's timers: the
    # figures' containers are looked up once per service (per configuration for a dispatch)
    # and updated in place here, each histogram as _ServiceHistogram.observe and each timer
    # as Timer.observe would, without a call per figure.
    def observe(self, service: str, status: int, seconds: float) -> None:
        try:
            buckets, timer = self._request_of[service]
        except KeyError:
            if service not in self.services:  # defensive: labels only from config
                self.unknown_service.inc()
                return
            timer = self._service_timers(service)[0]
            buckets = self.latency._counts[service]
            self._request_of[service] = (buckets, timer)
        counts = self.requests.counts
        key = (service, status)  # label values only ever come from the config: stays small
        try:
            counts[key] += 1
        except KeyError:
            counts[key] = 1
        buckets[bisect.bisect_left(self.latency._bounds, seconds)] += 1
        self.latency._sums[service] += seconds
        ms = seconds * 1000.0
        if not timer.count:
            timer.first = time.monotonic()
        timer.count += 1
        timer.recent.append(ms)
        if ms < timer.min:
            timer.min = ms
        if ms > timer.max:
            timer.max = ms

    def observe_dispatch(
        self, svc: ServiceConfig, status: int, dispatch_s: float, compute_us: int, body: bytes = b""
    ) -> None:
        """A call its backend answered (the dataplane's observer): any version of any service."""
        try:
            hit = self._dispatch_of[id(svc)]
        except KeyError:
            hit = None
        if hit is None or hit[0] is not svc:
            hit = self._dispatch_targets(svc)
            if hit is None:
                return
        _, service, pair, version_buckets, compute, queue, timers = hit
        versions = self.versions
        key = (*pair, status)
        try:
            versions.counts[key] += 1
        except KeyError:
            versions.counts[key] = 1
        bounds = versions.seconds.bounds
        version_buckets[bisect.bisect_left(bounds, dispatch_s)] += 1
        versions.seconds.sums[pair] += dispatch_s
        compute_s = compute_us / 1e6 if compute_us > 0 else 0.0
        queue_s = dispatch_s - compute_s
        if not queue_s > 0.0:
            queue_s = 0.0
        compute[bisect.bisect_left(bounds, compute_s)] += 1
        self.compute_time._sums[service] += compute_s
        queue[bisect.bisect_left(bounds, queue_s)] += 1
        self.queue_time._sums[service] += queue_s
        for timer, ms in ((timers[1], compute_s * 1000.0), (timers[2], queue_s * 1000.0)):
            if not timer.count:
                timer.first = time.monotonic()
            timer.count += 1
            timer.recent.append(ms)
            if ms < timer.min:
                timer.min = ms
            if ms > timer.max:
                timer.max = ms
        if status >= 500:
            self.last_error[service] = (time.time(), status, _processor_error(body))

    def _dispatch_targets(self, svc: ServiceConfig) -> _DispatchTargets | None:
        """What a dispatch to ``svc`` updates (None: not a configured service), kept by the
        configuration's identity: a reloaded service is a new one."""
        service, version = version_of(svc)
        if service not in self.services:
            return None
        pair = (service, version)
        version_buckets = self.versions.seconds.slot(pair)
        if len(self._dispatch_of) >= _DISPATCH_OF_MAX:
            self._dispatch_of.clear()
        hit = self._dispatch_of[id(svc)] = (
            svc, service, pair, version_buckets, self.compute_time._counts[service],
            self.queue_time._counts[service], self._service_timers(service),
        )  # fmt: skip
        return hit

    def observe_failure(self, svc: ServiceConfig, error: errors.GatewayError, dispatch_s: float) -> None:
        """A call its backend did not answer (refused, timed out, a worker lost, too large)."""
        service, version = version_of(svc)
        if service not in self.services:
            return
        self.versions.observe(service, version, error.status, dispatch_s)
        self.last_error[service] = (time.time(), error.status, error.message)

    def observe_mirror(
        self, service: str, mirror: str, outcome: str | None, seconds: float, in_flight: int
    ) -> None:
        """A copy of a call sent to the service's mirror ended, or was shed (the dataplane's observer)."""
        if service in self.services:
            self.mirrors.observe(service, mirror, outcome, seconds, in_flight)

    def _service_timers(self, service: str) -> tuple[Timer, Timer, Timer]:
        timers = self._timers_of.get(service)
        if timers is None:
            timers = self._timers_of[service] = (
                self.timers.timer(_timer(service, "request")),
                self.timers.timer(_timer(service, "compute")),
                self.timers.timer(_timer(service, "queue")),
            )
        return timers

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def render_json(self) -> bytes:
        """Cluster Serving's ``/metrics``: a JSON list of timers (gateway.observability.timers)."""
        return json.dumps(self.timers.snapshot()).encode()


# (the configuration, its service, (service, version), the version's dispatch buckets, the
# service's compute and queue buckets, its request, compute and queue timers)
_DispatchTargets = tuple[
    ServiceConfig, str, tuple[str, str], list[int], list[int], list[int], tuple[Timer, Timer, Timer]
]
_DISPATCH_OF_MAX = 256


def _timer(service: str, what: str) -> str:
    # Cluster Serving's names are dotted paths (bigdl.serving.redis.get).
    return f"easkit.{service}.{what}"
