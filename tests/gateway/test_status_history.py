"""The status page's last hour, kept on the server: what one point holds, the columns the
page draws, the ring's bound and a service added while the gateway runs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from gateway.config import ServiceConfig
from gateway.core import errors
from gateway.observability.history import StatusHistory
from gateway.observability.metrics import GatewayMetrics

SVC = ServiceConfig(
    name="m", processor="onnx", model="m.onnx", public=True, versions=(("1", "a"), ("2", "b"))
)


def _metrics() -> GatewayMetrics:
    return GatewayMetrics(CollectorRegistry(), ["m", "q"])


def test_a_point_holds_the_intervals_rates_refusals_latency_and_versions() -> None:
    metrics = _metrics()
    history = StatusHistory(metrics, interval_s=5.0)
    history.record(["m", "q"], {}, at=100.0, wall=1000.0)  # the first reading: no point yet
    assert not history.points
    for _ in range(8):
        metrics.observe("m", 200, 0.002)
    metrics.observe("m", 503, 0.3)
    metrics.observe("m", 401, 0.0001)
    metrics.observe("m", 429, 0.0001)
    metrics.unknown_service.inc(3)
    older = replace(SVC, name="m@1", versions=())
    for _ in range(4):
        metrics.observe_dispatch(SVC, 200, 0.002, 1000)
    metrics.observe_dispatch(older, 200, 0.004, 1000)
    metrics.observe_failure(older, errors.UpstreamTimeout("slow"), 5.0)
    gauges = {"m": {"workers": 2, "ready_workers": 1, "restarts": 4, "in_flight": 0}}
    gauges["q"] = {"queues": {"q": {"depth": 7, "lag": 5}}}
    history.record(["m", "q"], gauges, at=105.0, wall=1005.0)

    out = history.to_json()
    assert out["t"] == [1005.0] and out["interval_s"] == 5.0 and out["span_s"] == 3600.0
    assert out["unknown_rps"] == [0.6]
    m = out["services"]["m"]
    assert m["rate_rps"] == [2.2]  # 11 answers in 5 s, refusals included
    assert m["errors_rps"] == [0.2] and m["refused_rps"] == [0.4]
    assert 1.0 < m["p50_ms"][0] < 2.5 and m["p99_ms"][0] > 250
    assert (m["workers"], m["ready_workers"], m["restarts"], m["in_flight"]) == ([2], [1], [4], [0])
    # Per version: the latest under its own number, an older one under its name's.
    assert m["versions"]["2"]["rate_rps"] == [0.8] and m["versions"]["2"]["errors_rps"] == [0.0]
    assert m["versions"]["1"]["rate_rps"] == [0.4] and m["versions"]["1"]["errors_rps"] == [0.2]
    assert out["services"]["q"]["queues"] == {"q": {"depth": [7], "lag": [5]}}
    assert out["services"]["q"]["workers"] == [None]  # a queue has no workers

    # The next interval measures from this reading, not from the start.
    history.record(["m", "q"], gauges, at=110.0, wall=1010.0)
    out = history.to_json()
    assert out["services"]["m"]["rate_rps"] == [2.2, 0.0] and out["services"]["m"]["p99_ms"] == [
        pytest.approx(out["services"]["m"]["p99_ms"][0]),
        None,
    ]
    assert history.to_json(since=1005.0)["t"] == [1010.0]


def test_the_ring_keeps_its_span_and_a_new_service_starts_empty() -> None:
    metrics = _metrics()
    history = StatusHistory(metrics, interval_s=1.0, span_s=3.0)
    for i in range(6):
        names = ["m"] if i < 4 else ["m", "late"]
        if i == 4:
            metrics.add_service("late")
            metrics.observe("late", 200, 0.001)
        history.record(names, {}, at=float(i), wall=float(i))
    out = history.to_json()
    assert out["t"] == [3.0, 4.0, 5.0]  # the oldest points are gone
    assert out["services"]["late"]["rate_rps"] == [None, 1.0, 0.0]
    assert out["services"]["m"]["rate_rps"] == [0.0, 0.0, 0.0]


def test_metrics_export_the_version_figures_and_the_last_error() -> None:
    metrics = _metrics()
    metrics.observe_dispatch(SVC, 500, 0.01, 10, b'{"message": "boom"}')
    metrics.observe_failure(replace(SVC, name="m@1", versions=()), errors.ServiceNotReady("no worker"), 0.001)
    text = metrics.render().decode()
    assert 'easgw_version_requests_total{service="m",status="500",version="2"} 1.0' in text
    assert 'easgw_version_requests_total{service="m",status="503",version="1"} 1.0' in text
    assert 'easgw_version_dispatch_seconds_count{service="m",version="2"} 1.0' in text
    assert metrics.last_error["m"][1:] == (503, "no worker")
    metrics.unknown_service.inc()
    assert "easgw_unknown_service_requests_total 1.0" in metrics.render().decode()
