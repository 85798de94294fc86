"""A pipeline step whose predictor is another server, by URL (KServe's transformer in front
of ``--predictor_host``): one gateway is the predictor (an ONNX model and a slow Python
one), another runs pipelines that call it over V2 REST, V1 REST and V2 gRPC, compared with
ONNX Runtime; a predictor that is down, slow or refuses the token ends the step with 502 or
504 naming it, and the pipeline's gateway keeps serving.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from tests.e2e.gateway_proc import ROOT, GatewayProcess
from tests.redis_server import free_port

TOKEN = "remote-predictor-token-8e2d"
MODELS = f"{ROOT / 'tests' / 'e2e' / 'user_models.py'}"
PIXELS = np.random.default_rng(5).random((2, 64), dtype=np.float32)


@pytest.fixture(scope="module")
def predictor(
    tmp_path_factory: pytest.TempPathFactory, digits_model: Path
) -> Iterator[tuple[GatewayProcess, int]]:
    grpc_port = free_port()
    services = [
        {"name": "digits", "processor": "onnx", "model": str(digits_model), "token": TOKEN, "workers": 1},
        {"name": "slow", "processor": "python", "entry": f"{MODELS}:Sleeper", "token": TOKEN, "workers": 1,
         "config": {"seconds": 2.0}},
    ]  # fmt: skip
    gw = GatewayProcess.start(
        {"gateway": {"grpc_port": grpc_port}, "services": services}, tmp_path_factory.mktemp("p")
    )
    try:
        yield gw, grpc_port
    finally:
        gw.kill()


def _pipeline(
    name: str, predictor: dict[str, Any], x: str = "input", shape: list[int] | None = None
) -> dict[str, Any]:
    return {
        "name": name, "processor": "pipeline", "public": True, "timeout_ms": 5000,
        "pipeline": {
            "inputs": {"x": {"dtype": "float32", "shape": shape or [-1, 64]}},
            "steps": [{"name": "classify", "predictor": predictor, "inputs": {x: "request.x"},
                       "outputs": ["probabilities"] if x == "input" else ["y"]}],
            "outputs": {"out": "classify.probabilities" if x == "input" else "classify.y"},
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def transformer(
    predictor: tuple[GatewayProcess, int], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    gw, grpc_port = predictor
    url = gw.url
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    services = [
        _pipeline("via-v2", {"url": url, "model": "digits", "token": TOKEN}),
        _pipeline("via-v1", {"url": url, "model": "digits", "protocol": "v1", "token": TOKEN}),
        _pipeline(
            "via-grpc",
            {"url": f"127.0.0.1:{grpc_port}", "model": "digits", "protocol": "grpc", "token": TOKEN},
        ),
        _pipeline("via-down", {"url": down, "model": "digits", "retries": 1}),
        _pipeline("via-slow", {"url": url, "model": "slow", "token": TOKEN, "timeout_ms": 300}, "x", [-1, 3]),
        _pipeline("via-no-token", {"url": url, "model": "digits"}),
    ]
    proc = GatewayProcess.start({"services": services}, tmp_path_factory.mktemp("t"))
    try:
        yield proc
    finally:
        proc.kill()


def post(gw: GatewayProcess, service: str, x: np.ndarray) -> tuple[int, Any]:
    doc = {"inputs": {"x": {"dtype": "float32", "shape": list(x.shape), "data": x.ravel().tolist()}}}
    return gw.call_json(f"/api/predict/{service}", doc, timeout=20)


def test_a_step_calls_the_predictor_over_v2_v1_and_grpc(
    transformer: GatewayProcess, digits_model: Path
) -> None:
    want = ort.InferenceSession(str(digits_model)).run(["probabilities"], {"input": PIXELS})[0]
    for service in ("via-v2", "via-v1", "via-grpc"):
        status, body = post(transformer, service, PIXELS)
        assert status == 200, (service, body)
        out = body["outputs"]["out"]
        got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=service)


def test_a_predictor_down_slow_or_refusing_is_named_in_a_502_or_504(transformer: GatewayProcess) -> None:
    status, body = post(transformer, "via-down", PIXELS)
    assert status == 502, body
    assert (
        "step 'classify'" in body["message"] and "predictor 'digits' at http://127.0.0.1:" in body["message"]
    )
    assert "cannot reach it" in body["message"]
    status, body = post(transformer, "via-slow", np.ones((1, 3), np.float32))
    assert (
        status == 504
        and "predictor 'slow'" in body["message"]
        and "no answer within 300 ms" in body["message"]
    )
    status, body = post(transformer, "via-no-token", PIXELS)
    assert status == 502 and "answered 401" in body["message"], body
    assert TOKEN not in json.dumps(body)
    status, _ = post(transformer, "via-v2", PIXELS)  # the gateway goes on serving
    assert status == 200
