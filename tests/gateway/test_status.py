"""The status snapshot's arithmetic and its text form (who may read it: test_status_access)."""

from __future__ import annotations

import pytest

from gateway.cli.status_text import render
from gateway.observability.status import quantile

BOUNDS = [0.001, 0.002, 0.005]


def test_quantiles_interpolate_within_a_bucket() -> None:
    assert quantile(0.5, BOUNDS, [0, 0, 0, 0]) is None
    assert quantile(0.5, BOUNDS, [10, 0, 0, 0]) == pytest.approx(0.0005)
    assert quantile(0.5, BOUNDS, [0, 10, 0, 0]) == pytest.approx(0.0015)
    assert quantile(0.99, BOUNDS, [90, 9, 1, 0]) == pytest.approx(0.002)
    assert quantile(0.99, BOUNDS, [50, 0, 0, 50]) == 0.005  # beyond the last bound: at least it


def test_the_text_form_shows_every_figure() -> None:
    status = {
        "gateway": {"version": "1.2.3"},
        "uptime_s": 42.0,
        "window_s": 5.0,
        "services": [
            {"name": "svc", "processor": "onnx", "async": True, "ready": False, "rate_rps": 12.5,
             "p50_ms": 1.234, "p99_ms": None, "error_rate": 0.25, "requests_total": 99, "restarts": 2,
             "placement": "process", "placement_reason": "auto: autoscale needs worker processes",
             "workers": [{"id": 0, "pid": 7, "state": "backoff", "outstanding": 1, "restarts": 2}],
             "queues": {"svc": {"length": 4, "pending": 1, "lag": 3, "consumers": 1}}},
        ],
    }  # fmt: skip
    text = render(status)
    assert "gateway 1.2.3, up 42 s; rates over the last 5 s" in text
    row = next(line for line in text.splitlines() if line.startswith("svc"))
    assert row.split() == ["svc", "onnx*", "NO", "12.5", "1.23", "-", "25.0", "99", "2"]
    assert "    placement: process (auto: autoscale needs worker processes)" in text
    assert "    worker 0: pid 7, backoff, 1 in flight, 2 restarts" in text
    assert "    queue svc: depth 4, pending 1, lag 3, 1 consumers" in text
