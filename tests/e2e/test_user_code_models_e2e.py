"""User code as a model: ``python`` services that declare their tensors, called by the real
clients of the model protocols (Triton's ``tritonclient`` over HTTP and gRPC, KServe's
``InferenceRESTClient`` V1/V2 and ``InferenceGRPCClient``, run under .venv-clients, and
MLServer's V2 types and codecs, under .venv-mlserver), and
KServe's explain and status routes; what a processor that declares nothing answers.

One gateway serves ``scorer`` (class attributes, predict and explain), ``doubler``
(``metadata()``, predict, with ``attribution`` named as its explainer), ``legacy`` (a
process()-only class with ``metadata()``: the JSON form) and ``plain`` (the echo sample:
no declaration).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.e2e.gateway_proc import ECHO_ENTRY, ROOT, GatewayProcess
from tests.e2e.test_kserve_clients_e2e import call as kserve_call
from tests.e2e.test_kserve_clients_e2e import run_client

TOKEN = "user-code-models-token-5b0e"
MODELS = f"{ROOT / 'tests' / 'e2e' / 'user_models.py'}"
X = np.array([[1.0, 2.0, 3.0], [0.5, 0.25, 0.25]], dtype=np.float32)
SCALE = 2.0


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, grpc_port: int) -> Iterator[GatewayProcess]:
    def svc(name: str, entry: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "processor": "python", "entry": entry, "token": TOKEN, "workers": 1, **extra}

    config = {
        "gateway": {"grpc_port": grpc_port},
        "services": [
            svc("scorer", f"{MODELS}:Scorer", config={"scale": SCALE}),
            svc("doubler", f"{MODELS}:Doubler", explainer="attribution"),
            svc("attribution", f"{MODELS}:Attribution"),
            svc("legacy", f"{ROOT / 'tests' / 'e2e' / 'pipeline_predictor.py'}:ScorePredictor"),
            svc("plain", ECHO_ENTRY),
        ],
    }
    proc = GatewayProcess.start(config, tmp_path_factory.mktemp("user-code-models"))
    try:
        yield proc
    finally:
        proc.kill()


def call(gw: GatewayProcess, path: str, doc: Any = None) -> tuple[int, Any]:
    return kserve_call(gw, path, doc, token=TOKEN)


def v2_inputs(x: np.ndarray = X, tags: tuple[str, ...] = ("cat", "dög")) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()},
            {"name": "tag", "shape": [len(tags)], "datatype": "BYTES", "data": list(tags)},
        ]
    }


def outputs(body: dict[str, Any]) -> dict[str, list[Any]]:
    return {o["name"]: o["data"] for o in body["outputs"]}


@pytest.fixture(scope="module")
def clients(gw: GatewayProcess, grpc_port: int, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("clients")
    grpc_host = f"127.0.0.1:{grpc_port}"
    res = {}
    for family in ("triton", "kserve"):
        run_client(
            ".venv-clients", "user_code_models.py", family, f"127.0.0.1:{gw.port}", grpc_host, TOKEN, str(out)
        )
        res[family] = json.loads((out / f"{family}.json").read_text())
    return res


SCORES = (X.sum(axis=1) * SCALE).tolist()
LABELS = ["CAT", "DÖG"]


def test_triton_clients_call_user_code_as_a_model(clients: dict[str, Any]) -> None:
    res = clients["triton"]
    meta = res["metadata"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("x", "FP32", [-1, 3]),
        ("tag", "BYTES", [-1]),
    ]
    assert res["ready"] is True
    assert res["grpc_metadata"]["inputs"][0]["name"] == "x"
    for call_name in ("binary", "json", "grpc"):
        got = res[call_name]
        assert got["score"] == {"dtype": "float32", "shape": [2], "data": SCORES}, call_name
        assert got["label"]["data"] == LABELS, call_name
    # metadata() declares y as FP64: predict's float32 is answered as declared.
    assert res["doubler"] == {"dtype": "float64", "shape": [2, 3], "data": (X * 2).ravel().tolist()}


def test_bad_tensors_are_refused_naming_the_input(clients: dict[str, Any]) -> None:
    res = clients["triton"]
    assert res["wrong_dtype"].startswith("400") and "input 'x'" in res["wrong_dtype"], res
    assert "float32" in res["wrong_dtype"] and "float64" in res["wrong_dtype"]
    assert res["wrong_shape"].startswith("400") and "input 'x'" in res["wrong_shape"], res
    for case in ("undeclared", "grpc_undeclared"):
        assert "not served over V2: declare inputs/outputs" in res[case], res[case]
    assert res["undeclared"].startswith("404")
    assert "StatusCode.NOT_FOUND" in res["grpc_undeclared"] or res["grpc_undeclared"].startswith("404")


def test_kserve_clients_call_user_code_as_a_model(clients: dict[str, Any]) -> None:
    res = clients["kserve"]
    assert res["v2_ready"] is res["v1_ready"] is res["grpc_ready"] is True
    for call_name in ("v2_binary", "v2_json", "grpc"):
        assert res[call_name]["score"]["data"] == SCORES, call_name
        assert res[call_name]["label"]["data"] == LABELS, call_name
    assert res["v1_predict"]["predictions"] == [
        {"score": s, "label": lab} for s, lab in zip(SCORES, LABELS, strict=True)
    ]
    # explain(): the column that gave most to each row's score.
    assert res["v1_explain"]["predictions"] == [
        {"score": 2.0, "label": "column"},
        {"score": 0.0, "label": "column"},
    ]
    no_explainer = res["v1_no_explainer"]
    assert no_explainer.startswith("404 model 'attribution' has no explainer"), no_explainer
    assert res["grpc_undeclared"].startswith("NOT_FOUND"), res["grpc_undeclared"]
    assert "declare inputs/outputs" in res["grpc_undeclared"]


def test_mlserver_types_call_user_code_as_a_model(
    gw: GatewayProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = tmp_path_factory.mktemp("mlserver")
    run_client(".venv-mlserver", "mlserver_user_code.py", gw.url, TOKEN, str(out))
    res = json.loads((out / "mlserver.json").read_text())
    assert res == {"model_name": "scorer", "score": SCORES, "label": LABELS}


def test_v2_explain_by_the_model_and_by_its_explainer_service(gw: GatewayProcess) -> None:
    status, body = call(gw, "/v2/models/scorer/explain", v2_inputs())
    assert status == 200 and body["model_name"] == "scorer", body
    assert outputs(body) == {"score": [2.0, 0.0], "label": ["column", "column"]}
    doc = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": X.ravel().tolist()}]}
    status, body = call(gw, "/v2/models/doubler/explain", doc)
    assert status == 200 and body["model_name"] == "doubler", body
    np.testing.assert_allclose(outputs(body)["share"], (X / X.sum(axis=1, keepdims=True)).ravel(), rtol=1e-6)
    status, body = call(gw, "/v2/models/doubler/infer", doc)  # predict is still the model's own
    assert status == 200 and outputs(body)["y"] == (X * 2).ravel().tolist()


def test_explain_without_an_explainer_is_a_404_naming_what_is_missing(gw: GatewayProcess) -> None:
    doc = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": X.ravel().tolist()}]}
    for path in ("/v2/models/attribution/explain", "/v1/models/attribution:explain"):
        body = doc if path.startswith("/v2") else {"instances": X.tolist()}
        status, answer = call(gw, path, body)
        assert status == 404, (path, answer)
        assert "'attribution' has no explainer" in answer["error"] and "explain(inputs)" in answer["error"]
        assert "explainer: <service>" in answer["error"]
    status, answer = call(gw, "/v2/models/plain/explain", doc)
    assert status == 404 and "not served over V2" in answer["error"]
    status, answer = call(gw, "/v2/models/nope/explain", doc)
    assert status == 404 and "'nope' not found" in answer["error"]


def test_status_listing_and_what_stays_as_it_was(gw: GatewayProcess) -> None:
    assert call(gw, "/v2/models/scorer/status") == (200, {"name": "scorer", "ready": True})
    assert call(gw, "/v2/models/scorer/versions/1/status") == (200, {"name": "scorer", "ready": True})
    status, listing = call(gw, "/v2/models")
    assert status == 200 and set(listing["models"]) == {"scorer", "doubler", "attribution", "legacy"}
    status, body = call(gw, "/v2/models/plain")
    assert status == 404 and "declare inputs/outputs" in body["error"]
    # EAS bodies: the echo sample as ever; a predict-only class decodes the JSON form itself.
    req = urllib.request.Request(
        gw.url + "/api/predict/plain", data=b"hello", headers={"Authorization": TOKEN}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.read() == b"hello"
    eas_json = {"inputs": {"x": X.tolist(), "tag": ["a", "b"]}, "outputs": ["label"]}
    req = urllib.request.Request(
        gw.url + "/api/predict/scorer", data=json.dumps(eas_json).encode(), headers={"Authorization": TOKEN}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.loads(r.read())["outputs"]["label"]["data"] == ["A", "B"]


def test_process_only_code_that_declares_tensors_gets_the_json_form(gw: GatewayProcess) -> None:
    doc = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": X.ravel().tolist()}]}
    status, body = call(gw, "/v2/models/legacy/infer", doc)
    assert status == 200, body
    got = outputs(body)
    assert got["score"] == X.sum(axis=1).tolist() and got["label"] == ["high", "low"]
    status, body = call(gw, "/v2/models/scorer/infer", v2_inputs(np.full((1, 3), -1, np.float32), ("a",)))
    assert status == 400 and "predict() raised ValueError: x holds a negative value" in body["error"], body
