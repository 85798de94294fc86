"""Per-step timings of pipeline services: a Prometheus histogram by service and step, and
the ``Server-Timing`` answer header a caller asks for with ``X-Eas-Pipeline-Timings``."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# A caller sends this header (any value but "0"/"false") to get the answer's Server-Timing.
TIMINGS_HEADER = "X-Eas-Pipeline-Timings"
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class StepTimings(Collector):
    """``easgw_pipeline_step_seconds{service, step}``: plain bucket counts observed on the
    event loop (no lock per observation), exposed at scrape time as a histogram."""

    name = "easgw_pipeline_step_seconds"

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._les = [floatToGoString(b) for b in (*_BUCKETS, math.inf)]
        self._counts: dict[tuple[str, str], list[int]] = {}
        self._sums: dict[tuple[str, str], float] = {}
        if registry is not None:
            registry.register(self)

    def declare(self, service: str, steps: Iterable[str]) -> None:
        """Every step shows up from the start, before its first request."""
        for step in steps:
            self._counts.setdefault((service, step), [0] * len(self._les))
            self._sums.setdefault((service, step), 0.0)

    def observe(self, service: str, timings: Mapping[str, float]) -> None:
        for step, seconds in timings.items():
            counts = self._counts.get((service, step))
            if counts is None:
                continue
            counts[bisect.bisect_left(_BUCKETS, seconds)] += 1
            self._sums[(service, step)] += seconds

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(
            self.name, "Time spent in each step of a pipeline", labels=["service", "step"]
        )
        for key, counts in self._counts.items():
            family.add_metric(
                list(key), list(zip(self._les, itertools.accumulate(counts), strict=True)), self._sums[key]
            )
        yield family


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
