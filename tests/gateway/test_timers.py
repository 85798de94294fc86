"""Cluster Serving's JSON timers (gateway.observability.timers) and its top-N answer
(eas_sdk._core.cluster_serving.top_of): the figures, in order, from known durations."""

from __future__ import annotations

import numpy as np
import pytest

from eas_sdk._core.cluster_serving import top_classes, top_of
from gateway.observability.timers import FIELDS, RESERVOIR, Timers


def test_figures_of_known_durations_in_milliseconds() -> None:
    timers = Timers()
    timers.add("easkit.idle.request")
    for ms in range(1, 101):
        timers.observe("easkit.m.request", ms / 1000.0)
    idle, busy = timers.snapshot()
    assert idle == {"name": "easkit.idle.request", "count": 0, **dict.fromkeys(FIELDS[2:], 0.0)}
    assert list(busy) == list(FIELDS)
    assert busy["count"] == 100 and busy["meanRate"] > 0
    assert (busy["min"], busy["max"]) == pytest.approx((1.0, 100.0))
    assert busy["mean"] == pytest.approx(50.5) and busy["median"] == pytest.approx(50.5)
    assert busy["stdDev"] == pytest.approx(np.std(np.arange(1, 101), ddof=1))
    assert busy["_99thPercentile"] == pytest.approx(np.percentile(np.arange(1, 101), 99))


def test_the_distribution_is_of_the_latest_durations_count_and_extremes_of_all() -> None:
    timers = Timers()
    timers.observe("t", 5.0)
    for _ in range(RESERVOIR):
        timers.observe("t", 0.001)
    (t,) = timers.snapshot()
    assert t["count"] == RESERVOIR + 1 and t["max"] == pytest.approx(5000.0)
    assert t["median"] == pytest.approx(1.0) and t["_999thPercentile"] == pytest.approx(1.0)


def test_top_classes() -> None:
    assert top_classes(np.array([[0.1, 0.6, 0.3]], np.float32), 2) == {"1": 0.6, "2": 0.3}
    assert list(top_classes(np.array([0.2, 0.5, 0.2, 0.1]), 10)) == ["1", "0", "2", "3"]  # ties: lower first
    assert top_of({"p": np.array([1, 3])}, 1) == {"1": 3.0}
    with pytest.raises(ValueError, match=r"one vector of class probabilities, got float64\[2, 2\]"):
        top_classes(np.ones((2, 2)), 1)
    with pytest.raises(ValueError, match="positive integer"):
        top_classes(np.ones(2), True)  # type: ignore[arg-type]


def test_a_timer_kept_for_the_hot_path_is_listed_from_its_first_event() -> None:
    timers = Timers()
    timers.add("easkit.m.request")
    compute = timers.timer("easkit.m.compute")
    assert [t["name"] for t in timers.snapshot()] == ["easkit.m.request"]
    compute.observe(2.0)
    assert timers.timer("easkit.m.compute") is compute
    assert [(t["name"], t["count"]) for t in timers.snapshot()] == [
        ("easkit.m.compute", 1),
        ("easkit.m.request", 0),
    ]
