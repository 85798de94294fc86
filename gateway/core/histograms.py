"""Histograms counted on the event loop and written out for Prometheus at scrape time.

An observation is a bisect and two additions on plain lists, without prometheus_client's lock
per bucket and sum; the counts become a regular histogram family (``_bucket``, ``_count``,
``_sum``) only when the metrics are read. Several collectors keep one of these per set of
label values (a service's versions, its mirrors, a pipeline's steps).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class LabelledBuckets:
    """Per-bucket counts (not cumulative) and sums, keyed by a tuple of label values."""

    __slots__ = ("bounds", "counts", "les", "sums")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = list(bounds)  # upper bounds, seconds; one more bucket is unbounded
        self.les = [floatToGoString(b) for b in (*bounds, math.inf)]
        self.counts: dict[tuple[str, ...], list[int]] = {}
        self.sums: dict[tuple[str, ...], float] = {}

    def slot(self, key: tuple[str, ...]) -> list[int]:
        """``key``'s bucket counts, made (all zero) the first time: a label set shows up
        from then on, observed or not."""
        counts = self.counts.get(key)
        if counts is None:
            counts = self.counts[key] = [0] * len(self.les)
            self.sums[key] = 0.0
        return counts

    def observe(self, key: tuple[str, ...], seconds: float) -> None:
        self.slot(key)[bisect.bisect_left(self.bounds, seconds)] += 1  # "le": value <= bound
        self.sums[key] += seconds

    def family(self, name: str, doc: str, labels: Sequence[str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=list(labels))
        for key, counts in sorted(self.counts.items()):
            buckets = list(zip(self.les, itertools.accumulate(counts), strict=True))
            family.add_metric(list(key), buckets, self.sums[key])
        return family


__all__ = ["LabelledBuckets"]
