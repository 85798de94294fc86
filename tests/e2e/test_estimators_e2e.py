"""The sklearn, xgboost and lightgbm runtimes served by the real gateway, each model trained
by the test on iris: the SDK (EAS TF and JSON forms), the real ``eas-prediction`` client,
``tritonclient`` (HTTP binary and JSON, gRPC), KServe V1 and Paddle's feed/fetch all get the
numbers the library computes in-process; in worker processes (batched) and in the gateway's
threads, and as a pipeline step. A wrong dtype or shape is a 400 naming the input.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eas_sdk import PredictClient, StringRequest, TFRequest
from eas_sdk.errors import BadRequestError
from tests.e2e.estimator_models import MODELS, OUTPUTS, build, expected, features
from tests.e2e.gateway_proc import GatewayProcess
from tests.e2e.test_kserve_clients_e2e import run_client
from tests.eas_reference import run_reference

TOKEN = "estimators-token-3b8e61f0a2"
AUTH = {"Authorization": TOKEN}
# service -> the model it serves (tests/e2e/estimator_models.py)
SERVICES = {
    "sklearn": "sklearn",
    "sklearn-thread": "sklearn",
    "xgboost": "xgboost",
    "booster-thread": "booster",
    "lightgbm": "lightgbm",
    "lightgbm-thread": "lightgbm",
}
TF_DTYPES = {np.dtype(np.float32): TFRequest.DT_FLOAT, np.dtype(np.float64): TFRequest.DT_DOUBLE}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build(tmp_path_factory.mktemp("estimators"))


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path], grpc_port: int
) -> Iterator[GatewayProcess]:
    services: list[dict[str, Any]] = []
    for service, model in SERVICES.items():
        svc = {"name": service, "processor": MODELS[model][0], "model": str(models[model]), "token": TOKEN}
        if service.endswith("-thread"):
            svc["placement"] = "thread"
        else:  # named, as auto runs XGBoost's and LightGBM's in threads
            svc["placement"] = "process"
            svc["batching"] = {"max_batch_size": 32, "max_latency_ms": 2}
        services.append(svc)
    services.append(
        {"name": "iris-pipeline", "processor": "pipeline", "token": TOKEN, "pipeline": {
            "inputs": {"x": {"dtype": "float32", "shape": [-1, 4]}},
            "steps": [
                {"name": "proba", "service": "xgboost", "inputs": {"input": "request.x"},
                 "outputs": ["predict_proba"]},
                {"name": "top", "transform": "argmax", "inputs": {"x": "proba.predict_proba"},
                 "outputs": ["index"]},
            ],
            "outputs": {"label": "top.index", "proba": "proba.predict_proba"},
        }}
    )  # fmt: skip
    config = {
        "gateway": {"grpc_port": grpc_port, "model_dirs": [str(next(iter(models.values())).parent)]},
        "services": services,
    }
    proc = GatewayProcess.start(config, tmp_path_factory.mktemp("estimators-gw"))
    try:
        for service in SERVICES:
            if not service.endswith("-thread"):
                proc.wait_workers_ready(service, 1, timeout=60)
        yield proc
    finally:
        proc.kill()


def want(models: dict[str, Path], service: str, x: np.ndarray) -> dict[str, np.ndarray]:
    model = SERVICES.get(service, service)
    return expected(model, models[model], x)


def same(got: np.ndarray, wanted: np.ndarray, what: str) -> None:
    """The library's numbers, bit for bit, in its dtype."""
    got = np.asarray(got)
    assert got.shape == wanted.shape, what
    np.testing.assert_array_equal(got.astype(wanted.dtype), wanted, err_msg=what)


def post(gw: GatewayProcess, path: str, doc: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    return gw.call_json(
        path, doc, {"Content-Type": "application/json", **AUTH, **(headers or {})}, timeout=30
    )


def get(gw: GatewayProcess, path: str) -> Any:
    status, body = gw.call_json(path, headers=AUTH)
    assert status == 200, body
    return body


def test_metadata_comes_from_the_model(gw: GatewayProcess) -> None:
    meta = get(gw, "/v2/models/sklearn")
    assert meta["platform"] == "sklearn"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP64", "shape": [-1, 4]}]
    assert meta["outputs"] == [
        {"name": "predict", "datatype": "INT64", "shape": [-1]},
        {"name": "predict_proba", "datatype": "FP64", "shape": [-1, 3]},
    ]
    meta = get(gw, "/v2/models/xgboost")
    assert (meta["platform"], meta["inputs"][0]["datatype"]) == ("xgboost", "FP32")
    assert [o["name"] for o in meta["outputs"]] == ["predict", "predict_proba"]
    meta = get(gw, "/v2/models/booster-thread")
    assert meta["outputs"] == [{"name": "predict", "datatype": "FP32", "shape": [-1, 3]}]
    cfg = get(gw, "/v2/models/xgboost/config")
    assert (cfg["platform"], cfg["backend"]) == ("xgboost", "xgboost")
    assert [(t["name"], t["data_type"]) for t in cfg["input"]] == [("input", "TYPE_FP32")]
    meta = get(gw, "/v2/models/lightgbm")
    assert meta["platform"] == "lightgbm"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP64", "shape": [-1, 4]}]
    assert meta["outputs"] == [{"name": "predict", "datatype": "FP64", "shape": [-1, 3]}]


@pytest.mark.parametrize("service", list(SERVICES))
def test_sdk_tf_and_json_forms(gw: GatewayProcess, models: dict[str, Path], service: str) -> None:
    model = SERVICES[service]
    x = features(model)
    wanted = want(models, service, x)
    with PredictClient(gw.url, service, token=TOKEN) as client:
        req = TFRequest("serving_default")
        req.add_feed("input", list(x.shape), TF_DTYPES[x.dtype], x)
        resp = client.predict(req)
        for name in OUTPUTS[model]:
            same(resp.to_numpy(name), wanted[name], f"{service} tf {name}")
        answer = client.predict(StringRequest(json.dumps({"inputs": {"input": x.tolist()}})))
    outs = json.loads(answer.response_data)["outputs"]
    assert list(outs) == list(OUTPUTS[model])
    for name, t in outs.items():
        same(
            np.array(t["data"], dtype=t["dtype"]).reshape(t["shape"]), wanted[name], f"{service} json {name}"
        )


def test_v1_and_paddle_forms(gw: GatewayProcess, models: dict[str, Path]) -> None:
    x = features("lightgbm")
    wanted = want(models, "lightgbm", x)
    status, body = post(gw, "/v1/models/lightgbm:predict", {"instances": x.tolist()})
    assert status == 200, body
    same(np.array(body["predictions"]), wanted["predict"], "v1")
    x = features("sklearn")
    wanted = want(models, "sklearn", x)
    status, body = post(gw, "/sklearn/prediction", {"feed": [{"input": row} for row in x.tolist()],
                                                    "fetch": ["predict"]})  # fmt: skip
    assert status == 200, body
    assert list(body["result"]) == ["predict"]
    same(np.array(body["result"]["predict"]).reshape(-1), wanted["predict"], "paddle")


def test_v2_json_and_many_calls_at_once(gw: GatewayProcess, models: dict[str, Path]) -> None:
    """Calls at once on the batched services: each gets its own rows' answers (labels exactly;
    probabilities to the last bits, which the library's own vectorised arithmetic changes with
    the number of rows it is given at once)."""

    def one(i: int) -> None:
        service = ("sklearn", "xgboost", "lightgbm")[i % 3]
        model = SERVICES[service]
        x = features(model, slice(i, i + 1 + i % 4))
        wanted = want(models, service, x)
        datatype = "FP32" if x.dtype == np.float32 else "FP64"
        doc = {
            "inputs": [
                {"name": "input", "shape": list(x.shape), "datatype": datatype, "data": x.ravel().tolist()}
            ]
        }
        status, body = post(gw, f"/v2/models/{service}/infer", doc)
        assert status == 200, body
        for out in body["outputs"]:
            got, w = np.array(out["data"]).reshape(out["shape"]), wanted[out["name"]]
            np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-15, err_msg=f"{service} #{i}")

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(one, range(36)))


@pytest.mark.parametrize("service", ["sklearn", "booster-thread", "lightgbm"])
def test_wrong_dtype_or_shape_is_a_400_naming_the_input(gw: GatewayProcess, service: str) -> None:
    x = features(SERVICES[service])
    other = "FP32" if x.dtype == np.float64 else "FP64"
    doc = {
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": other, "data": x.ravel().tolist()}]
    }
    status, body = post(gw, f"/v2/models/{service}/infer", doc)
    assert status == 400 and "input 'input'" in body["error"], body
    narrow = x[:, :3]
    with PredictClient(gw.url, service, token=TOKEN) as client:
        req = TFRequest("serving_default")
        req.add_feed("input", list(narrow.shape), TF_DTYPES[x.dtype], np.ascontiguousarray(narrow))
        with pytest.raises(BadRequestError) as info:
            client.predict(req)
        assert info.value.code == 400 and "input 'input'" in str(info.value)
        assert "[-1,4]" in str(info.value)
        ok = TFRequest("serving_default")
        ok.add_feed("input", list(x.shape), TF_DTYPES[x.dtype], x)
        assert client.predict(ok).to_numpy("predict").shape[0] == len(x)  # still serving


def test_pipeline_step(gw: GatewayProcess, models: dict[str, Path]) -> None:
    x = features("xgboost")
    wanted = want(models, "xgboost", x)
    with PredictClient(gw.url, "iris-pipeline", token=TOKEN) as client:
        req = TFRequest("serving_default")
        req.add_feed("x", list(x.shape), TFRequest.DT_FLOAT, x)
        resp = client.predict(req)
    same(resp.to_numpy("proba"), wanted["predict_proba"], "pipeline proba")
    same(resp.to_numpy("label"), wanted["predict"], "pipeline label")


REFERENCE_CODE = r"""
import json, sys
from eas_prediction import PredictClient, StringRequest, TFRequest
endpoint, token, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
out = {}
for service, (values, dtype, outputs) in calls.items():
    client = PredictClient(endpoint, service)
    client.set_token(token)
    client.init()
    req = TFRequest("serving_default")
    flat = [v for row in values for v in row]
    req.add_feed("input", [len(values), len(values[0])],
                 TFRequest.DT_DOUBLE if dtype == "float64" else TFRequest.DT_FLOAT, flat)
    resp = client.predict(req)
    got = {name: list(resp.get_values(name)) for name in outputs}
    text = client.predict(StringRequest(json.dumps({"inputs": {"input": values}}))).response_data
    out[service] = {"tf": got, "json": json.loads(text)["outputs"]}
    client.destroy()
print(json.dumps(out))
"""


@pytest.mark.compat
def test_reference_client(gw: GatewayProcess, models: dict[str, Path]) -> None:
    calls = {}
    for service in ("sklearn", "xgboost", "booster-thread", "lightgbm"):
        x = features(SERVICES[service])
        calls[service] = (x.tolist(), str(x.dtype), OUTPUTS[SERVICES[service]])
    proc = run_reference(REFERENCE_CODE, gw.endpoint, TOKEN, json.dumps(calls), timeout=60)
    result = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    for service, (values, dtype, outputs) in calls.items():
        wanted = want(models, service, np.array(values, dtype=dtype))
        for name in outputs:
            same(np.array(result[service]["tf"][name]).reshape(wanted[name].shape), wanted[name], service)
            t = result[service]["json"][name]
            same(np.array(t["data"], dtype=t["dtype"]).reshape(t["shape"]), wanted[name], service)


@pytest.mark.compat
def test_tritonclient_http_and_grpc(
    gw: GatewayProcess, models: dict[str, Path], grpc_port: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = tmp_path_factory.mktemp("triton-estimators")
    given = {s: features(SERVICES[s]) for s in ("sklearn-thread", "xgboost", "booster-thread", "lightgbm")}
    np.savez(out / "in.npz", **given)
    grpc = f"127.0.0.1:{grpc_port}"
    run_client(".venv-clients", "triton_estimators.py", f"127.0.0.1:{gw.port}", grpc, TOKEN,
               str(out / "in.npz"), str(out))  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    with np.load(out / "arrays.npz", allow_pickle=False) as arrays:
        got = dict(arrays)
    for service, x in given.items():
        wanted = want(models, service, x)
        res = results[service]
        assert res["metadata"]["platform"] == MODELS[SERVICES[service]][0]
        assert [o["name"] for o in res["grpc_metadata"]["outputs"]] == list(OUTPUTS[SERVICES[service]])
        for call in ("binary", "json", "grpc"):
            for name in OUTPUTS[SERVICES[service]]:
                same(got[f"{service}.{call}.{name}"], wanted[name], f"{service} {call} {name}")
        assert res["wrong_dtype"].startswith("400") and "input 'input'" in res["wrong_dtype"], res


def test_serve_model_files_without_a_config(tmp_path: Path, models: dict[str, Path]) -> None:
    """``serve --model`` picks each file's runtime by its suffix; the pickle's folder is the
    one model folder allowed, as the operator named the file; the printed curl runs."""
    args = ("--model", str(models["sklearn"]), "--model", str(models["lightgbm"]), "--name", "iris")
    gw = GatewayProcess.start({}, tmp_path / "gw", serve_args=args, env={"EASGW_DATA_DIR": str(tmp_path)})
    try:
        meta = get(gw, "/v2/models/iris")
        assert meta["platform"] == "sklearn"
        assert get(gw, "/v2/models/iris-lgb")["platform"] == "lightgbm"
        out = gw.output()
        curl = next(
            line for line in out.split("service iris: ", 1)[1].splitlines() if line.startswith("  curl")
        )
        ran = subprocess.run(
            ["bash", "-c", curl.split(": ", 1)[1]], capture_output=True, text=True, timeout=30
        )
        answer = {o["name"]: o for o in json.loads(ran.stdout)["outputs"]}
        zeros = np.zeros((1, 4))
        same(np.array(answer["predict"]["data"]), want(models, "sklearn", zeros)["predict"], "zeros")
    finally:
        assert gw.stop() == 0
