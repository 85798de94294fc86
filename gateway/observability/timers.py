"""Timers in Cluster Serving's JSON form (Dropwizard's ``Timer`` as its ``/metrics`` lists
them): what ``GET /metrics`` answers a client that asks for ``application/json``.

Each timer counts its events since the gateway started and keeps the latest
:data:`RESERVOIR` durations (Dropwizard's default reservoir size), from which the
distribution figures are computed when asked. Durations are in milliseconds, as Cluster
Serving reports them; ``meanRate`` is events per second since the timer's first event.
Observed on the event loop only: a deque append and two comparisons, no lock.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

# Dropwizard's default (exponentially decaying) reservoir holds 1028 samples.
RESERVOIR = 1028
# The figures of one timer, in the order Cluster Serving lists them.
FIELDS = (
    "name", "count", "meanRate", "min", "max", "mean", "median", "stdDev", "_75thPercentile",
    "_95thPercentile", "_98thPercentile", "_99thPercentile", "_999thPercentile",
)  # fmt: skip
_PERCENTILES = (("median", 50.0), ("_75thPercentile", 75.0), ("_95thPercentile", 95.0),
                ("_98thPercentile", 98.0), ("_99thPercentile", 99.0), ("_999thPercentile", 99.9))  # fmt: skip


class Timer:
    __slots__ = ("count", "first", "max", "min", "recent")

    def __init__(self) -> None:
        self.count = 0
        self.first = 0.0
        self.min = float("inf")
        self.max = 0.0
        self.recent: deque[float] = deque(maxlen=RESERVOIR)

    def observe(self, ms: float) -> None:
        if not self.count:
            self.first = time.monotonic()
        self.count += 1
        self.recent.append(ms)
        if ms < self.min:
            self.min = ms
        if ms > self.max:
            self.max = ms

    def figures(self, name: str, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "count": self.count}
        if not self.count:
            return {**out, **dict.fromkeys(FIELDS[2:], 0.0)}
        elapsed = now - self.first
        out["meanRate"] = self.count / elapsed if elapsed > 0 else 0.0
        out["min"], out["max"] = self.min, self.max
        sample = np.fromiter(self.recent, dtype=np.float64, count=len(self.recent))
        out["mean"] = float(sample.mean())
        out["stdDev"] = float(sample.std(ddof=1)) if sample.size > 1 else 0.0
        values = np.percentile(sample, [p for _, p in _PERCENTILES])
        out.update({key: float(v) for (key, _), v in zip(_PERCENTILES, values, strict=True)})
        return {k: out[k] for k in FIELDS}


class Timers:
    """Named timers: ``easkit.<service>.<what>``. A timer is listed once it has an event, or
    from the start when :meth:`add` named it."""

    def __init__(self) -> None:
        self._timers: dict[str, Timer] = {}
        self._listed: set[str] = set()

    def add(self, name: str) -> None:
        """List ``name`` from now on, with no event yet."""
        self._timers.setdefault(name, Timer())
        self._listed.add(name)

    def timer(self, name: str) -> Timer:
        """The timer of ``name`` to observe directly (a caller on the hot path keeps it
        rather than look it up by name on every call)."""
        timer = self._timers.get(name)
        if timer is None:
            timer = self._timers[name] = Timer()
        return timer

    def observe(self, name: str, seconds: float) -> None:
        self.timer(name).observe(seconds * 1000.0)

    def snapshot(self) -> list[dict[str, Any]]:
        """Every listed timer's figures, by name."""
        now = time.monotonic()
        return [
            timer.figures(name, now)
            for name, timer in sorted(self._timers.items())
            if timer.count or name in self._listed
        ]


__all__ = ["FIELDS", "RESERVOIR", "Timer", "Timers"]
