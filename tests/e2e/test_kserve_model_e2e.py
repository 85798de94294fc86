"""Existing ``kserve.Model`` subclasses (tests/e2e/kserve_custom_model.py) served unchanged by
``python`` services: ``load``, ``preprocess``, ``predict`` (async), ``postprocess`` and
``explain`` run as KServe's model server runs them (its own ``Model.__call__``), over KServe
V1, EAS calls and V2 (REST, JSON and binary, and gRPC ModelInfer), where a V2 call reaches the
model as KServe's ``InferRequest`` and its ``InferResponse`` (or V2 dict) is the answer.

The gateway's own environment has not the kserve package (it would move protobuf to another
major version), so the real gateway runs as a process under .venv-clients' Python, with the
checkout on its path; the calls come from this process over HTTP and from KServe's own
clients (InferenceRESTClient, InferenceGRPCClient) in .venv-clients
(clients/kserve_model_calls.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.gateway_proc import ROOT, GatewayProcess
from tests.e2e.test_kserve_clients_e2e import run_client, venv_python

TOKEN = "kserve-model-token-61fa"
MODELS = ROOT / "tests" / "e2e" / "kserve_custom_model.py"
AUTH = {"Authorization": TOKEN}


@pytest.fixture(scope="module")
def predictor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """The predictor a transformer calls: another gateway (this environment), serving user code
    that declares its tensors under the transformer's name, as KServe's predictor is named."""
    entry = f"{ROOT / 'tests' / 'e2e' / 'user_models.py'}:Scorer"
    config = {"services": [{"name": "relay", "processor": "python", "entry": entry, "workers": 1}]}
    proc = GatewayProcess.start(config, tmp_path_factory.mktemp("kserve-predictor"))
    try:
        proc.wait_workers_ready("relay", 1)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, grpc_port: int, predictor: GatewayProcess
) -> Iterator[GatewayProcess]:
    def svc(name: str, cls: str, **extra: Any) -> dict[str, Any]:
        entry = f"{MODELS}:{cls}"
        return {"name": name, "processor": "python", "entry": entry, "token": TOKEN, "workers": 1, **extra}

    config = {
        "gateway": {"grpc_port": grpc_port},
        "services": [
            svc("scaler", "Scaler", config={"factor": 3.0}),
            svc("plain", "Plain"),
            svc("counter", "Counter"),
            svc("relay", "Relay", config={"predictor_host": predictor.endpoint, "predictor_protocol": "v2"}),
        ],
    }
    proc = GatewayProcess.start(
        config,
        tmp_path_factory.mktemp("kserve-model"),
        python=venv_python(".venv-clients"),
        env={"PYTHONPATH": str(ROOT)},
    )
    try:
        for name in ("scaler", "plain", "counter", "relay"):
            proc.wait_workers_ready(name, 1)
        yield proc
    finally:
        proc.stop()


def call(gw: GatewayProcess, path: str, doc: Any = None, auth: bool = True) -> tuple[int, Any]:
    return gw.call_json(path, doc, AUTH if auth else {})


@pytest.fixture(scope="module")
def clients(gw: GatewayProcess, grpc_port: int, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("kserve-model-clients")
    run_client(
        ".venv-clients",
        "kserve_model_calls.py",
        f"127.0.0.1:{gw.port}",
        f"127.0.0.1:{grpc_port}",
        TOKEN,
        str(out),
    )
    return dict(json.loads((out / "results.json").read_text()))


DOC = {"instances": [[1, -2], [0.5, 0.5]]}
PREDICTED = {"predictions": [[3.0, -6.0], [1.5, 1.5]], "model": "scaler", "loaded": True}


def test_predict_and_explain_run_as_kserve_runs_them(gw: GatewayProcess) -> None:
    assert call(gw, "/v1/models/scaler:predict", DOC) == (200, PREDICTED)
    status, body = call(gw, "/v1/models/scaler:explain", DOC)
    assert status == 200 and body["explanations"] == [[0.333, 0.667], [0.5, 0.5]]
    assert body["model"] == "scaler"  # postprocess ran after explain, as KServe runs it
    assert call(gw, "/api/predict/scaler", DOC) == (200, PREDICTED)  # EAS: the same model
    status, models = gw.get_json("/v1/models")
    assert status == 200 and set(models["models"]) == {"scaler", "plain", "counter", "relay"}


def test_what_such_a_model_refuses_over_v1(gw: GatewayProcess) -> None:
    # A model's own exception: 500 naming its type, as KServe's server answers it.
    status, body = call(gw, "/v1/models/scaler:predict", {"rows": []})
    assert (status, body) == (500, {"error": "ValueError : expected {'instances': [...]}"})
    status, body = call(gw, "/v1/models/plain:explain", DOC)
    assert status == 404 and "'plain' has no explainer" in body["error"], body
    assert call(gw, "/v1/models/scaler:predict", DOC, auth=False)[0] == 401


def test_v2_rest_hands_the_model_an_infer_request(gw: GatewayProcess) -> None:
    doc = {
        "id": "req-1",
        "parameters": {"top": 2, "mode": "fast"},
        "inputs": [
            {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, -2, 0.5, 0.25]},
            {"name": "tag", "shape": [1], "datatype": "BYTES", "data": ["dög"]},
        ],
    }
    status, body = call(gw, "/v2/models/scaler/infer", doc)
    assert status == 200, body
    assert (body["model_name"], body["id"]) == ("scaler", "req-1")
    y, seen, got = body["outputs"]
    assert y == {"name": "y", "datatype": "FP32", "shape": [2, 2], "data": [3.0, -6.0, 1.5, 0.75]}
    # Each input as KServe's endpoint hands a tensor over: its datatype and shape, data a list.
    assert seen["data"] == ["x:FP32:[2, 2]:list", "tag:BYTES:[1]:list"], seen
    # The call's own id and parameters, in the model's InferRequest.
    assert got["data"] == ["req-1", '{"mode": "fast", "top": 2}'], got
    doc.pop("id")
    doc.pop("parameters")
    status, body = call(gw, "/v2/models/scaler/infer", doc)
    assert status == 200, body
    assert body["outputs"][2]["data"] == ["None", "{}"], body  # none sent: none, as KServe


def test_v2_metadata_and_ready(gw: GatewayProcess) -> None:
    assert call(gw, "/v2/models/scaler/ready")[0] == 200
    status, meta = call(gw, "/v2/models/scaler")
    assert status == 200 and (meta["name"], meta["inputs"], meta["outputs"]) == ("scaler", [], [])
    status, meta = call(gw, "/v2/models/counter")  # what get_input_types/get_output_types say
    assert status == 200, meta
    assert meta["inputs"] == [{"name": "b", "datatype": "UINT8", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "next", "datatype": "UINT8", "shape": [-1]}]


def test_v2_errors_answer_as_kserve_answers_them(gw: GatewayProcess) -> None:
    x = {"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 2]}
    status, body = call(gw, "/v2/models/scaler/infer", {"inputs": [x]})
    assert (status, body) == (400, {"error": "expected an FP32 input 'x'"})  # InvalidInput
    flat = {**x, "datatype": "FP32"}
    status, body = call(gw, "/v2/models/scaler/infer", {"inputs": [flat]})
    assert (status, body) == (500, {"error": "RuntimeError : x must be rows, got shape [2]"})
    status, body = call(gw, "/v2/models/plain/infer", {"inputs": [flat]})
    assert status == 500 and body["error"].startswith("TypeError : "), body
    assert call(gw, "/v1/models/scaler:predict", DOC) == (200, PREDICTED)  # still serving


def test_kserve_clients_over_v2_rest_and_grpc(clients: dict[str, Any]) -> None:
    y = {"datatype": "FP32", "shape": [2, 2], "data": [3.0, -6.0, 1.5, 0.75]}
    assert clients["rest_ready"] is True and clients["grpc_ready"] is True
    for call_, request_id in (
        ("rest_json", "rest_json-7"),
        ("rest_binary", "rest_binary-7"),
        ("grpc", "grpc-9"),
    ):
        got = clients[call_]
        assert (got["model_name"], got["id"]) == ("scaler", request_id), got
        assert got["outputs"]["y"] == y, got
        assert got["outputs"]["seen"]["data"] == ["x:FP32:[2, 2]:list"], got
        call_id, params = got["outputs"]["call"]["data"]
        assert call_id == request_id, got
        sent = {"tag": call_, "top": 3}
        if call_ == "grpc":
            sent["exact"] = True
        # What the client sent, binary_data_output (its own flag for binary answers) aside.
        assert {k: v for k, v in json.loads(params).items() if k != "binary_data_output"} == sent, got
    assert list(clients["rest_asked"]["outputs"]) == ["y"]  # the outputs asked for, as KServe
    counter = clients["rest_counter"]["outputs"]["next"]
    assert counter == {"datatype": "UINT8", "shape": [3], "data": [2, 3, 0]}
    assert clients["v1"]["predictions"] == [[3.0, -6.0], [1.5, 0.75]]
    status, body = clients["rest_refused"]
    assert (status, body) == (400, {"error": "expected an FP32 input 'x'"})
    assert clients["grpc_refused"] == ["INVALID_ARGUMENT", "expected an FP32 input 'x'"]
    code, details = clients["grpc_failed"]
    assert code == "INTERNAL" and details.startswith("TypeError : "), clients["grpc_failed"]


def test_a_transformer_reaches_its_predictor(gw: GatewayProcess) -> None:
    x = {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 0.5, 0.25, 0.25]}
    status, body = call(gw, "/v2/models/relay/infer", {"id": "via-1", "inputs": [x]})
    assert status == 200, body
    assert (body["model_name"], body["id"]) == ("relay", "via-1")
    outputs = {o["name"]: o["data"] for o in body["outputs"]}
    assert outputs == {"score": [6.0, 1.0], "label": ["RELAYED", "RELAYED"]}  # preprocess's tag
