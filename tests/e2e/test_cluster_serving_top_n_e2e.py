"""Cluster Serving's top-N answers and JSON timers against a real gateway: ``top_n`` on
``OutputQueue.query``/``dequeue`` and on the HTTP predict answer (``{"class": probability}``,
most probable first), compared with ONNX Runtime's own probabilities; ``GET /metrics`` as
Cluster Serving's JSON list of timers when asked for JSON, Prometheus text otherwise.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from eas_sdk.cluster_serving import InputQueue, OutputQueue
from gateway.observability.timers import FIELDS
from tests.e2e.gateway_proc import GatewayProcess

TOKEN = "cs-top-n-token-3c1f"
ROWS = np.random.default_rng(7).random((3, 64), dtype=np.float32) * 2


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> Iterator[GatewayProcess]:
    svc = {"name": "digits", "processor": "onnx", "model": str(digits_model), "async": True, "token": TOKEN}
    gw = GatewayProcess.start({"services": [svc]}, tmp_path_factory.mktemp("cs-top-n"))
    try:
        yield gw
    finally:
        gw.kill()


@pytest.fixture(scope="module")
def probabilities(digits_model: Path) -> np.ndarray:
    session = ort.InferenceSession(str(digits_model))
    return np.asarray(session.run(["probabilities"], {"input": ROWS})[0])


def top(row: np.ndarray, n: int) -> list[str]:
    return [str(i) for i in np.argsort(-row.astype(np.float64), kind="stable")[:n]]


def post(gw: GatewayProcess, path: str, doc: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    return gw.call_json(path, doc, {"Authorization": TOKEN, **(headers or {})})


def test_query_and_dequeue_answer_the_top_n_classes(
    gateway: GatewayProcess, probabilities: np.ndarray
) -> None:
    with (
        InputQueue(endpoint=gateway.endpoint, name="digits", token=TOKEN) as iq,
        OutputQueue(endpoint=gateway.endpoint, name="digits", token=TOKEN) as oq,
    ):
        oq.dequeue()
        for i, row in enumerate(ROWS):
            iq.enqueue(f"row-{i}", input=row)
        got = oq.query("row-0", timeout="10s", top_n=3, output="probabilities")
        assert list(got) == top(probabilities[0], 3)  # most probable first
        np.testing.assert_allclose(
            [got[k] for k in got], probabilities[0][[int(k) for k in got]], rtol=1e-4, atol=1e-7
        )
        assert all(isinstance(v, float) for v in got.values())
        several = r"several outputs \(label, probabilities\); name one with output="
        with pytest.raises(ValueError, match=several):
            oq.query("row-0", top_n=3)
        with pytest.raises(ValueError, match="top_n must be a positive integer"):
            oq.query("row-0", top_n=0, output="probabilities")
        assert oq.query("row-2", timeout="10s", top_n=1, output="probabilities") is not None
        results = oq.dequeue(top_n=2, output="probabilities")
        assert set(results) == {"row-0", "row-1", "row-2"}
        for i in range(3):
            assert list(results[f"row-{i}"]) == top(probabilities[i], 2)


def test_http_predict_answers_the_top_n_classes(gateway: GatewayProcess, probabilities: np.ndarray) -> None:
    doc = {"instances": [{"input": row.tolist()} for row in ROWS]}
    status, body = post(gateway, "/api/cluster-serving/digits/predict?top_n=4&output=probabilities", doc)
    assert status == 200, body
    assert [list(p) for p in body["predictions"]] == [top(row, 4) for row in probabilities]
    first = body["predictions"][0]
    np.testing.assert_allclose(
        list(first.values()), probabilities[0][[int(k) for k in first]], rtol=1e-4, atol=1e-7
    )
    # Without top_n the answer is as it was: every output of every instance.
    status, body = post(gateway, "/api/cluster-serving/digits/predict", doc)
    assert status == 200 and set(body["predictions"][0]) == {"label", "probabilities"}
    for query, message in (
        ("top_n=0&output=probabilities", "top_n must be a positive integer, got '0'"),
        ("top_n=x", "top_n must be a positive integer, got 'x'"),
        ("top_n=2", "several outputs (label, probabilities); name one with output="),
        ("top_n=2&output=nope", "no output 'nope'; the outputs are label, probabilities"),
        ("top_n=2&output=label", "top_n needs output 'label' to be one vector of class probabilities"),
    ):
        status, body = post(gateway, f"/api/cluster-serving/digits/predict?{query}", doc)
        assert status == 400 and message in body["error"], (query, body)


def test_metrics_are_json_timers_when_asked_and_prometheus_otherwise(gateway: GatewayProcess) -> None:
    doc = {"instances": [{"input": ROWS[0].tolist()}]}
    for _ in range(3):
        assert post(gateway, "/api/cluster-serving/digits/predict", doc)[0] == 200
    req = urllib.request.Request(gateway.url + "/metrics", headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("application/json")
        timers = {t["name"]: t for t in json.loads(r.read())}
    request = timers["easkit.digits.request"]
    assert list(request) == list(FIELDS)
    assert request["count"] >= 3 and request["meanRate"] > 0
    assert 0 < request["min"] <= request["median"] <= request["_99thPercentile"] <= request["max"]
    assert timers["easkit.digits.compute"]["count"] >= 3
    with urllib.request.urlopen(gateway.url + "/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        assert b"easgw_request_duration_seconds_bucket" in r.read()
