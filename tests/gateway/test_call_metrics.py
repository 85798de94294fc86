"""What one call adds to the gateway's figures: the Prometheus counters and histograms and
Cluster Serving's JSON timers agree with the same durations fed to the timers one by one,
and a service reloaded with a new latest version counts its calls under that version."""

from __future__ import annotations

import json
from dataclasses import replace

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import ServiceConfig
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.timers import Timers

SVC = ServiceConfig(name="m", processor="onnx", model="m.onnx", versions=(("1", "a"), ("2", "b")))


def _samples(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("easgw_") and family.name != "easgw_asyncio_tasks"
        for s in family.samples
    }


def test_a_calls_figures_match_the_timers_fed_one_by_one() -> None:
    metrics = GatewayMetrics(CollectorRegistry(), ["m"])
    reference = Timers()
    reference.add("easkit.m.request")
    # (gateway seconds, dispatch seconds, compute microseconds): the last computes longer
    # than its dispatch (clocks apart), which counts no negative queue time.
    for total, dispatch, compute in ((0.004, 0.003, 1000), (0.02, 0.012, 11000), (0.3, 0.001, 2000)):
        metrics.observe_dispatch(SVC, 200, dispatch, compute)
        metrics.observe("m", 200, total)
        compute_s = compute / 1e6
        reference.observe("easkit.m.compute", compute_s)
        reference.observe("easkit.m.queue", max(0.0, dispatch - compute_s))
        reference.observe("easkit.m.request", total)
    metrics.observe("m", 404, 0.0001)
    reference.observe("easkit.m.request", 0.0001)
    metrics.observe("nope", 200, 0.1)

    got = {t["name"]: t for t in json.loads(metrics.render_json())}
    want = {t["name"]: t for t in reference.snapshot()}
    assert got.keys() == want.keys() == {"easkit.m.request", "easkit.m.compute", "easkit.m.queue"}
    for name, figures in want.items():
        assert {k: v for k, v in got[name].items() if k != "meanRate"} == {
            k: v for k, v in figures.items() if k != "meanRate"
        }
    samples = _samples(metrics)
    assert samples[("easgw_requests_total", (("service", "m"), ("status", "200")))] == 3
    assert samples[("easgw_requests_total", (("service", "m"), ("status", "404")))] == 1
    assert samples[("easgw_unknown_service_requests_total", ())] == 1
    assert samples[("easgw_request_duration_seconds_count", (("service", "m"),))] == 4
    assert samples[("easgw_compute_seconds_sum", (("service", "m"),))] == 0.014
    queue = (("le", "0.0025"), ("service", "m"))
    assert samples[("easgw_queue_time_seconds_bucket", queue)] == 3  # 0.002, 0.001, 0.0
    version = (("service", "m"), ("status", "200"), ("version", "2"))
    assert samples[("easgw_version_requests_total", version)] == 3
    assert samples[("easgw_version_dispatch_seconds_count", (("service", "m"), ("version", "2")))] == 3


def test_a_reloaded_service_counts_under_its_new_latest_version() -> None:
    metrics = GatewayMetrics(CollectorRegistry(), ["m"])
    metrics.observe_dispatch(SVC, 200, 0.001, 500)
    reloaded = replace(SVC, versions=(*SVC.versions, ("3", "c")))
    metrics.observe_dispatch(reloaded, 503, 0.001, 500)
    metrics.observe_dispatch(replace(SVC, name="m@1", versions=()), 200, 0.001, 500)
    assert metrics.versions.counts == {("m", "2", 200): 1, ("m", "3", 503): 1, ("m", "1", 200): 1}
    assert metrics.versions.figures("m", "3")[:2] == (1, 1)
    assert metrics.last_error["m"][1] == 503
