"""The sklearn, xgboost and lightgbm runtimes served by the real gateway, each model trained
by the test on iris: the SDK (EAS TF, Torch, Blade and JSON forms), the real ``eas-prediction``
client, ``tritonclient`` (HTTP binary and JSON, gRPC), KServe V1 and Paddle's feed/fetch and
key/value forms all get the numbers the library computes in-process; in worker processes
(batched) and in the gateway's threads, and as a pipeline step. A wrong dtype or shape is a
400 naming the input, in each form's own error shape.
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

from eas_sdk import BladeRequest, PredictClient, StringRequest, TFRequest
from eas_sdk.errors import BadRequestError
from tests.e2e.estimator_models import MODELS, OUTPUTS, build, expected, features
from tests.e2e.gateway_proc import GatewayProcess
from tests.e2e.model_forms import check_torch_request, described, kv_outputs, refused, v1_output
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
# Torch's ArrayProto has a double field as TF's does: each model's dtype travels as it is.


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
    # The JSON form states a dtype only when the client gives one, and then it must be the model's.
    other = "float32" if x.dtype == np.float64 else "float64"
    typed = {"shape": list(x.shape), "dtype": other, "data": x.ravel().tolist()}
    narrow = x[:, :-1]
    with PredictClient(gw.url, service, token=TOKEN) as client:
        for given, got in (
            (typed, described(other, x.shape)),
            (narrow.tolist(), described(x.dtype.name, narrow.shape)),
        ):
            with pytest.raises(BadRequestError) as info:
                client.predict(StringRequest(json.dumps({"inputs": {"input": given}})))
            assert info.value.code == 400, info.value
            refused(info.value.message, "input", got)


@pytest.mark.parametrize("service", list(SERVICES))
def test_v1_form(gw: GatewayProcess, models: dict[str, Path], service: str) -> None:
    """KServe V1: one prediction per row. Its JSON numbers carry no dtype (they are cast to the
    model's), so the wrong type a client can send is text; that, and rows of the wrong width,
    are a 400 naming the input."""
    model = SERVICES[service]
    outputs = OUTPUTS[model]
    x = features(model)
    wanted = want(models, service, x)
    status, body = post(gw, f"/v1/models/{service}:predict", {"instances": x.tolist()})
    assert status == 200, body
    assert len(body["predictions"]) == len(x), body
    for name in outputs:
        same(v1_output(body["predictions"], name, outputs), wanted[name], f"{service} v1 {name}")
    narrow, text = x[:, :-1], np.full(x.shape, "a")
    for rows, got in (
        (narrow, described(x.dtype.name, narrow.shape)),
        (text, described("string", text.shape)),
    ):
        status, body = post(gw, f"/v1/models/{service}:predict", {"instances": rows.tolist()})
        assert status == 400, body
        refused(body["error"], "input", got)


@pytest.mark.parametrize("service", list(SERVICES))
def test_paddle_forms(gw: GatewayProcess, models: dict[str, Path], service: str) -> None:
    """Paddle's web service feed/fetch (one instance per row, stacked) and its pipeline's
    key/value form (one instance in a value's text): the library's numbers. Text for a number
    and rows of the wrong width are a 400 naming the input, in Paddle's error shape."""
    model = SERVICES[service]
    outputs = OUTPUTS[model]
    x = features(model)
    wanted = want(models, service, x)
    status, body = post(gw, f"/{service}/prediction",
                        {"feed": [{"input": row} for row in x.tolist()], "fetch": list(outputs)})  # fmt: skip
    assert status == 200, body
    assert list(body["result"]) == list(outputs)
    for name in outputs:
        same(np.array(body["result"][name]), wanted[name], f"{service} paddle {name}")
    lone = want(models, service, x[:1])  # one row run alone: its own numbers, to the last bit
    status, body = post(
        gw, f"/{service}/prediction", {"key": ["input"], "value": [json.dumps(x[0].tolist())]}
    )
    assert status == 200, body
    got = kv_outputs(body)
    assert list(got) == list(outputs)
    for name in outputs:
        same(got[name].reshape(lone[name].shape), lone[name], f"{service} key/value {name}")
    narrow, text = x[:, :-1], np.full(x.shape, "a")
    for rows, what in (
        (narrow, described(x.dtype.name, narrow.shape)),
        (text, described("string", text.shape)),
    ):
        status, body = post(gw, f"/{service}/prediction", {"feed": [{"input": row} for row in rows.tolist()]})
        assert status == 400 and body["err_no"] == 400, body
        refused(body["err_msg"], "input", what)
    status, body = post(
        gw, f"/{service}/prediction", {"key": ["input"], "value": [json.dumps(narrow[0].tolist())]}
    )
    assert status == 400 and (body["err_no"], body["key"], body["value"]) == (400, [], []), body
    refused(body["err_msg"], "input", described(x.dtype.name, (1, narrow.shape[1])))


@pytest.mark.parametrize("service", list(SERVICES))
def test_blade_request(gw: GatewayProcess, models: dict[str, Path], service: str) -> None:
    """A BladeRequest feeds the model's input by name. Blade has no double field, so values
    travel as float32 both ways: a float64 model (sklearn, lightgbm) gets the rows as float32
    holds them, and its float64 outputs come back as float32. The answer is the library's for
    those rows, as float32 holds it. Rows of the wrong width, or text, are a 400 naming the input."""
    model = SERVICES[service]
    outputs = OUTPUTS[model]
    x = features(model).astype(np.float32)
    dtype = np.dtype(MODELS[model][2])
    wanted = {
        name: w.astype(np.float32) if w.dtype == np.float64 else w
        for name, w in want(models, service, x.astype(dtype)).items()
    }
    with PredictClient(gw.url, service, token=TOKEN) as client:
        req = BladeRequest("serving_default")
        req.add_feed("input", len(x), list(x.shape), BladeRequest.DT_FLOAT, x)
        resp = client.predict(req)
        assert resp.output_names() == list(outputs)
        for name in outputs:
            same(resp.to_numpy(name), wanted[name], f"{service} blade {name}")
        req = BladeRequest("serving_default")
        req.add_feed("input", len(x), list(x.shape), BladeRequest.DT_FLOAT, x)
        req.add_fetch(outputs[-1], BladeRequest.DT_UNKNOWN)
        only = client.predict(req)
        assert only.output_names() == [outputs[-1]]
        same(only.to_numpy(outputs[-1]), wanted[outputs[-1]], f"{service} blade fetch")
        narrow, text = np.ascontiguousarray(x[:, :-1]), np.full(x.shape, b"a")
        for dt, rows, got in (
            (BladeRequest.DT_FLOAT, narrow, described(dtype.name, narrow.shape)),  # cast, then checked
            (BladeRequest.DT_STRING, text, described("string", text.shape)),
        ):
            req = BladeRequest("serving_default")
            req.add_feed("input", len(rows), list(rows.shape), dt, rows)
            with pytest.raises(BadRequestError) as info:
                client.predict(req)
            assert info.value.code == 400, info.value
            refused(info.value.message, "input", got)


@pytest.mark.parametrize("service", list(SERVICES))
def test_torch_request_by_position(gw: GatewayProcess, models: dict[str, Path], service: str) -> None:
    """The Torch form, by position: the library's numbers bit for bit (model_forms.check_torch_request)."""
    model = SERVICES[service]
    outputs = OUTPUTS[model]
    x = features(model)
    wanted = want(models, service, x)
    with PredictClient(gw.url, service, token=TOKEN) as client:
        check_torch_request(client, x, outputs, wanted, "input", service, same)


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
