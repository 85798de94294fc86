"""Per-step timings of pipeline services: a Prometheus histogram by service and step, and
the ``Server-Timing`` answer header a caller asks for with ``X-Eas-Pipeline-Timings``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gateway.core.histograms import LabelledBuckets

# A caller sends this header (any value but "0"/"false") to get the answer's Server-Timing.
TIMINGS_HEADER = "X-Eas-Pipeline-Timings"
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class StepTimings(Collector):
    """``easgw_pipeline_step_seconds{service, step}``: plain bucket counts observed on the
    event loop (no lock per observation), exposed at scrape time as a histogram."""

    name = "easgw_pipeline_step_seconds"

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._seconds = LabelledBuckets(_BUCKETS)
        if registry is not None:
            registry.register(self)

    def declare(self, service: str, steps: Iterable[str]) -> None:
        """Every step shows up from the start, before its first request."""
        for step in steps:
            self._seconds.slot((service, step))

    def observe(self, service: str, timings: Mapping[str, float]) -> None:
        declared = self._seconds.counts
        for step, seconds in timings.items():
            if (service, step) in declared:
                self._seconds.observe((service, step), seconds)

    def collect(self) -> Iterable[Metric]:
        yield self._seconds.family(self.name, "Time spent in each step of a pipeline", ("service", "step"))


def wants_timings(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no")


def timings_asked(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The header to hand a backend when the caller asks for timings (an adapter that calls
    the dataplane with headers of its own), else None. ``headers``: case-insensitive, or
    gRPC metadata's lowercase keys."""
    value = headers.get(TIMINGS_HEADER)
    if value is None:
        value = headers.get(TIMINGS_HEADER.lower())
    return {TIMINGS_HEADER: value} if wants_timings(value) else None


def server_timing(timings: Mapping[str, float], total: float) -> str:
    """``Server-Timing`` (W3C): each step's duration in milliseconds, then the whole run."""
    parts = [f"{step};dur={seconds * 1000:.3f}" for step, seconds in timings.items()]
    parts.append(f"total;dur={total * 1000:.3f}")
    return ", ".join(parts)


__all__ = ["TIMINGS_HEADER", "StepTimings", "server_timing", "timings_asked", "wants_timings"]
