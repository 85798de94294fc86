"""A pipeline step's own model named by a URL, end to end against moto's S3 server: fetched
through the gateway's download cache for a step on worker processes and for one in the
gateway's threads, the pipeline answering with both; a step whose fetch fails is the
pipeline's not-ready reason, naming the URL and the store's error, never a credential."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import GatewayProcess
from tests.e2e.test_model_sources_e2e import BUCKET, S3, _config, _doubling_model  # skips without moto
from tests.waiting import wait_until


@pytest.fixture
def s3() -> Iterator[S3]:
    server = S3()
    try:
        yield server
    finally:
        server.stop()


def _pipeline(name: str, steps: list[dict[str, Any]], last: str) -> dict[str, Any]:
    return {
        "name": name,
        "processor": "pipeline",
        "public": True,
        "pipeline": {
            "inputs": {"x": {"dtype": "float32", "shape": [-1, 64]}},
            "steps": steps,
            "outputs": {"y": f"{last}.doubled"},
        },
    }


def _call(gw: GatewayProcess, name: str, values: list[float]) -> tuple[int, dict[str, Any]]:
    body = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": values}]}
    return gw.call_json(f"/v2/models/{name}/infer", body, {"Content-Type": "application/json"}, timeout=30)


@pytest.mark.timeout(180)
def test_pipeline_steps_fetch_their_models_by_url(s3: S3, tmp_path: Path, gateway_factory: Any) -> None:
    doubling = tmp_path / "doubling.onnx"
    _doubling_model(doubling)
    s3.put("steps/double.onnx", doubling)
    url, missing = f"s3://{BUCKET}/steps/double.onnx", f"s3://{BUCKET}/steps/missing.onnx"
    twice = _pipeline(
        "twice",
        [
            {"name": "first", "model": url, "inputs": {"input": "request.x"}, "outputs": ["doubled"]},
            {
                "name": "second",
                "model": url,
                "placement": "thread",
                "inputs": {"input": "first.doubled"},
                "outputs": ["doubled"],
            },
        ],
        "second",
    )
    broken = [
        _pipeline(
            f"broken-{placement}",
            [
                {
                    "name": "lost",
                    "model": missing,
                    "placement": placement,
                    "inputs": {"input": "request.x"},
                    "outputs": ["doubled"],
                }
            ],
            "lost",
        )
        for placement in ("process", "thread")
    ]
    gw = gateway_factory(_config(s3, tmp_path, [twice, *broken]))
    wait_until(lambda: gw.services()["twice"]["ready"], 60, "twice ready")
    status, answer = _call(gw, "twice", [1.5] * 64)
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [6.0] * 64
    # Both steps load the one file fetched into the gateway's cache.
    (cached,) = (tmp_path / "cache").glob("*/*/double.onnx")
    assert cached.read_bytes() == doubling.read_bytes()

    def reasons() -> dict[str, str]:
        return {n: s.get("reason", "") for n, s in gw.services().items() if n.startswith("broken")}

    wait_until(lambda: all("cannot fetch" in r for r in reasons().values()), 60, "two failed fetches")
    for name, reason in reasons().items():
        assert reason.startswith(f"step lost: cannot fetch model {missing}: NoSuchKey"), (name, reason)
        status, answer = _call(gw, name, [1.0] * 64)
        assert status == 503, answer
        assert f"{missing}: NoSuchKey" in json.dumps(answer), answer
    assert s3.secret not in gw.output() and s3.key_id not in gw.output()
    assert gw.services()["twice"]["ready"]  # the others serve on
