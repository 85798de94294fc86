"""The torch, tensorflow and pmml runtimes served by the real gateway, over the sample models
(samples/runtimes/build_models.py, built by the test): the SDK (EAS Torch, TF, Blade and JSON
forms, the PMML list of records), the real ``eas-prediction`` client (the EAS guide's own
demos, unchanged, and a call per runtime), ``tritonclient`` (HTTP binary and JSON, gRPC),
KServe V1 and Paddle's feed/fetch and key/value forms all get the numbers the library
computes in-process; in worker processes (batched) and in the gateway's threads, and as
pipeline steps (a service a step calls; each file as a step's own model, in the gateway's
threads or on worker processes of its own). A wrong dtype or shape is a 400 naming the
input, in each form's own error shape.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eas_sdk import BladeRequest, PredictClient, StringRequest, TFRequest
from eas_sdk.errors import BadRequestError
from tests.e2e.gateway_proc import GatewayProcess
from tests.e2e.model_forms import check_torch_request, described, kv_outputs, refused, v1_output
from tests.e2e.runtime_models import (
    MODELS,
    OUTPUTS,
    PLATFORMS,
    TF_SIGNATURE,
    TORCH_INPUTS,
    build,
    expected,
    features,
    same,
)
from tests.e2e.test_kserve_clients_e2e import run_client
from tests.eas_reference import ROOT, run_reference
from tests.runtime_libraries import require_runtime

# Skipped where a runtime is missing, failed under CI.
for module in ("torch", "tensorflow", "sklearn_pmml_model"):
    require_runtime(module)

# Starting takes a while on a busy machine: the threads' services load TensorFlow and PyTorch
# in the gateway itself before it answers, and the workers each load theirs.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOKEN = "runtimes-token-5c1d07e94b"
AUTH = {"Authorization": TOKEN}
# The EAS guide's services (samples/runtimes/services.yaml): their names and tokens.
GUIDE_TOKENS = {
    "scorecard_pmml_example": "YWFlMDYyZDNmNTc3M2I3MzMwYmY0MmYwM2Y2MTYxMTY4NzBkNzdj****",
    "mnist_saved_model_example": "YTg2ZjE0ZjM4ZmE3OTc0NzYxZDMyNmYzMTJjZTQ1YmU0N2FjMTAy****",
}
# service -> the runtime whose sample model it serves
SERVICES = {
    "pytorch_gpu_wl": "torch",
    "torch-thread": "torch",
    "mnist_saved_model_example": "tensorflow",
    "tensorflow-thread": "tensorflow",
    "scorecard_pmml_example": "pmml",
    "pmml-thread": "pmml",
}
BATCHED = ("pytorch_gpu_wl", "mnist_saved_model_example", "scorecard_pmml_example")
# A pipeline whose steps run the three sample files as their own models: step -> runtime.
OWN_MODEL_STEPS = {"net": "torch", "mnist": "tensorflow", "score": "pmml"}
# The rows a call of each form sends: one image is 150,528 numbers, which JSON spells out.
ROWS = {"torch": 1, "tensorflow": 2, "pmml": 4}
# Torch's ArrayProto has a double field as TF's does: each model's dtype travels as it is.


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build(tmp_path_factory.mktemp("runtimes"))


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path], grpc_port: int
) -> Iterator[GatewayProcess]:
    services: list[dict[str, Any]] = []
    for service, runtime in SERVICES.items():
        svc: dict[str, Any] = {"name": service, "processor": runtime, "model": str(models[runtime])}
        if service in GUIDE_TOKENS:
            svc.update(token=GUIDE_TOKENS[service], tokens=[TOKEN])
        else:  # the guide's PyTorch demo sets no token: its service is open, as in services.yaml
            svc.update(public=True) if service == "pytorch_gpu_wl" else svc.update(token=TOKEN)
        if runtime == "torch":
            svc["inputs"] = TORCH_INPUTS
        if service in BATCHED:
            svc["batching"] = {"max_batch_size": 16, "max_latency_ms": 2}
        else:
            svc["placement"] = "thread"
        services.append(svc)
    services.append(
        {"name": "scorecard-pipeline", "processor": "pipeline", "token": TOKEN, "pipeline": {
            "inputs": {"x": {"dtype": "float64", "shape": [-1, 2]}},
            "steps": [
                {"name": "score", "service": "pmml-thread", "inputs": {"input": "request.x"},
                 "outputs": ["predict_proba"]},
                {"name": "top", "transform": "argmax", "inputs": {"x": "score.predict_proba"},
                 "outputs": ["index"]},
            ],
            "outputs": {"label": "top.index", "proba": "score.predict_proba"},
        }}
    )  # fmt: skip
    services.append(own_model_pipeline(models))
    config = {"gateway": {"grpc_port": grpc_port}, "services": services}
    proc = GatewayProcess.start(
        config, tmp_path_factory.mktemp("runtimes-gw"), env={"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=240
    )
    try:
        for service in BATCHED:
            proc.wait_workers_ready(service, 1, timeout=180)
        # one entry per step, the thread step's as soon as its model is loaded
        proc.wait_workers_ready("dl-pipeline", len(OWN_MODEL_STEPS), timeout=180)
        yield proc
    finally:
        proc.kill()


def own_model_pipeline(models: dict[str, Path]) -> dict[str, Any]:
    """Each step runs a sample file as its own model, reading a request input of its own: the
    TorchScript module in the gateway's threads (its input is forward's argument, ``image``:
    the file keeps no dtype, so the pipeline's declaration types it), the SavedModel folder
    on worker processes of its own (the default; tensorflow, as the folder holds
    saved_model.pb; its default signature), the PMML file with its runtime named."""
    return {
        "name": "dl-pipeline", "processor": "pipeline", "token": TOKEN, "pipeline": {
            "inputs": {
                "image": {"dtype": "float32", "shape": [-1, 3, 224, 224]},
                "pixels": {"dtype": "float32", "shape": [-1, 784]},
                "x": {"dtype": "float64", "shape": [-1, 2]},
            },
            "steps": [
                {"name": "net", "model": str(models["torch"]), "placement": "thread",
                 "inputs": {"image": "request.image"}, "outputs": list(OUTPUTS["torch"])},
                {"name": "mnist", "model": str(models["tensorflow"]),
                 "inputs": {"images": "request.pixels"}, "outputs": list(OUTPUTS["tensorflow"])},
                {"name": "score", "model": str(models["pmml"]), "processor": "pmml",
                 "inputs": {"input": "request.x"}, "outputs": list(OUTPUTS["pmml"])},
            ],
            "outputs": {
                f"{step}_{out}": f"{step}.{out}" for step, runtime in OWN_MODEL_STEPS.items()
                for out in OUTPUTS[runtime]
            },
        },
    }  # fmt: skip


def want(
    models: dict[str, Path], service: str, x: np.ndarray, signature: str = TF_SIGNATURE
) -> dict[str, Any]:
    runtime = SERVICES.get(service, service)
    return expected(runtime, models[runtime], x, signature)


def post(gw: GatewayProcess, path: str, doc: Any, token: str = TOKEN) -> tuple[int, Any]:
    return gw.call_json(path, doc, {"Content-Type": "application/json", "Authorization": token}, timeout=60)


def get(gw: GatewayProcess, path: str) -> Any:
    status, body = gw.call_json(path, headers=AUTH)
    assert status == 200, body
    return body


def test_metadata_comes_from_the_model(gw: GatewayProcess) -> None:
    meta = get(gw, "/v2/models/pytorch_gpu_wl")
    assert meta["platform"] == "pytorch_libtorch"
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 224, 224]}]
    assert meta["outputs"] == [
        {"name": "output__0", "datatype": "FP32", "shape": [-1, 10]},
        {"name": "output__1", "datatype": "INT64", "shape": [-1]},
    ]
    meta = get(gw, "/v2/models/tensorflow-thread")
    assert meta["platform"] == "tensorflow_savedmodel"
    assert meta["inputs"] == [{"name": "images", "datatype": "FP32", "shape": [-1, 784]}]
    assert meta["outputs"] == [
        {"name": "classes", "datatype": "INT64", "shape": [-1]},
        {"name": "scores", "datatype": "FP32", "shape": [-1, 10]},
    ]
    meta = get(gw, "/v2/models/scorecard_pmml_example")
    assert meta["platform"] == "pmml"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP64", "shape": [-1, 2]}]
    assert meta["outputs"] == [
        {"name": "predict", "datatype": "INT64", "shape": [-1]},
        {"name": "predict_proba", "datatype": "FP64", "shape": [-1, 2]},
    ]


@pytest.mark.parametrize("service", list(SERVICES))
def test_torch_request_by_position(gw: GatewayProcess, models: dict[str, Path], service: str) -> None:
    """The Torch form, by position (model_forms.check_torch_request); a TensorFlow model answers
    with its default signature, as the request names none."""
    runtime = SERVICES[service]
    name, outputs = MODELS[runtime][1], OUTPUTS[runtime]
    x = features(runtime, ROWS[runtime])
    wanted = want(models, service, x, "serving_default")
    with PredictClient(gw.url, service, token=TOKEN) as client:
        check_torch_request(client, x, outputs, wanted, name, service, same)


@pytest.mark.parametrize("service", ["mnist_saved_model_example", "tensorflow-thread"])
def test_tf_request_names_the_signature_and_blade_too(
    gw: GatewayProcess, models: dict[str, Path], service: str
) -> None:
    x = features("tensorflow")
    token = GUIDE_TOKENS.get(service, TOKEN)
    with PredictClient(gw.url, service, token=token) as client:
        for signature in (TF_SIGNATURE, "serving_default"):
            wanted = want(models, service, x, signature)
            req = TFRequest(signature)
            req.add_feed("images", list(x.shape), TFRequest.DT_FLOAT, x)
            resp = client.predict(req)
            for name in OUTPUTS["tensorflow"]:
                same(resp.to_numpy(name), wanted[name], f"{service} {signature} {name}")
        req = TFRequest(TF_SIGNATURE)
        req.add_feed("images", list(x.shape), TFRequest.DT_FLOAT, x)
        req.add_fetch("classes")
        only = client.predict(req)
        assert only.to_numpy("classes").tolist() == wanted["classes"].tolist()
        blade = BladeRequest(TF_SIGNATURE)
        blade.add_feed("images", len(x), list(x.shape), BladeRequest.DT_FLOAT, x)
        blade.add_fetch("scores", BladeRequest.DT_FLOAT)
        same(client.predict(blade).to_numpy("scores"), wanted["scores"], f"{service} blade")
        req = TFRequest("predict_digits")
        req.add_feed("images", list(x.shape), TFRequest.DT_FLOAT, x)
        with pytest.raises(BadRequestError) as info:
            client.predict(req)
    assert "unknown signature 'predict_digits'" in str(info.value)
    assert "predict_images, serving_default" in str(info.value)


@pytest.mark.parametrize("service", ["scorecard_pmml_example", "pmml-thread"])
def test_pmml_records_and_tensors(gw: GatewayProcess, models: dict[str, Path], service: str) -> None:
    x = features("pmml", 4)
    wanted = want(models, service, x)
    token = GUIDE_TOKENS.get(service, TOKEN)
    records = [{"fea1": a, "fea2": b} for a, b in x.tolist()]
    with PredictClient(gw.url, service, token=token) as client:
        rows = json.loads(client.predict(StringRequest(json.dumps(records))).response_data)
        req = TFRequest("serving_default")
        req.add_feed("input", list(x.shape), TFRequest.DT_DOUBLE, x)
        resp = client.predict(req)
    assert [r["y"] for r in rows] == wanted["predict"].tolist()
    proba = np.array([[r["probability(0)"], r["probability(1)"]] for r in rows])
    same(proba, wanted["predict_proba"], f"{service} records")
    for name in OUTPUTS["pmml"]:
        same(resp.to_numpy(name), wanted[name], f"{service} tf {name}")


@pytest.mark.parametrize("service", list(SERVICES))
def test_json_form(gw: GatewayProcess, models: dict[str, Path], service: str) -> None:
    """The JSON form in a StringRequest (TensorFlow's default signature): an input as a nested
    list, or flat with its dtype and shape, outputs chosen by name. A dtype the client states
    must be the model's; a wrong dtype or shape is a 400 naming the input."""
    runtime = SERVICES[service]
    name, outputs = MODELS[runtime][1], OUTPUTS[runtime]
    x = features(runtime, ROWS[runtime])
    wanted = want(models, service, x, "serving_default")
    typed = {"shape": list(x.shape), "dtype": x.dtype.name, "data": x.ravel().tolist()}
    with PredictClient(gw.url, service, token=TOKEN) as client:
        calls = (
            ({"inputs": {name: x.tolist()}}, list(outputs)),  # every output when none is named
            ({"inputs": {name: typed}, "outputs": [outputs[-1]]}, [outputs[-1]]),
        )
        for doc, fetched in calls:
            outs = json.loads(client.predict(StringRequest(json.dumps(doc))).response_data)["outputs"]
            assert list(outs) == fetched
            for out, t in outs.items():
                got = np.array(t["data"], dtype=t["dtype"]).reshape(t["shape"])
                same(got, wanted[out], f"{service} json {out}")
        other = "float64" if x.dtype == np.float32 else "float32"
        narrow = x[..., :-1]
        for given, what in (
            ({**typed, "dtype": other}, described(other, x.shape)),
            (narrow.tolist(), described(x.dtype.name, narrow.shape)),
        ):
            with pytest.raises(BadRequestError) as info:
                client.predict(StringRequest(json.dumps({"inputs": {name: given}})))
            assert info.value.code == 400, info.value
            refused(info.value.message, name, what)


@pytest.mark.parametrize("service", list(SERVICES))
def test_blade_request(gw: GatewayProcess, models: dict[str, Path], service: str) -> None:
    """A BladeRequest feeds the model's input by name (TensorFlow's signature as it names it).
    Blade has no double field, so values travel as float32 both ways: the float64 PMML model
    gets the rows as float32 holds them, and its probabilities come back as float32. The
    answer is the library's for those rows, as float32 holds it. A wrong shape, or text, is a
    400 naming the input."""
    runtime = SERVICES[service]
    name, outputs = MODELS[runtime][1], OUTPUTS[runtime]
    dtype = np.dtype(MODELS[runtime][2])
    x = features(runtime, ROWS[runtime]).astype(np.float32)
    wanted = {
        out: w.astype(np.float32) if w.dtype == np.float64 else w
        for out, w in want(models, service, x.astype(dtype), "serving_default").items()
    }
    with PredictClient(gw.url, service, token=TOKEN) as client:
        req = BladeRequest("serving_default")
        req.add_feed(name, len(x), list(x.shape), BladeRequest.DT_FLOAT, x)
        resp = client.predict(req)
        assert resp.output_names() == list(outputs)
        for out in outputs:
            same(resp.to_numpy(out), wanted[out], f"{service} blade {out}")
        req = BladeRequest("serving_default")
        req.add_feed(name, len(x), list(x.shape), BladeRequest.DT_FLOAT, x)
        req.add_fetch(outputs[-1], BladeRequest.DT_UNKNOWN)
        only = client.predict(req)
        assert only.output_names() == [outputs[-1]]
        same(only.to_numpy(outputs[-1]), wanted[outputs[-1]], f"{service} blade fetch")
        narrow, text = np.ascontiguousarray(x[..., :-1]), np.full(x.shape, b"a")
        for dt, given, what in (
            (BladeRequest.DT_FLOAT, narrow, described(dtype.name, narrow.shape)),  # cast, then checked
            (BladeRequest.DT_STRING, text, described("string", text.shape)),
        ):
            req = BladeRequest("serving_default")
            req.add_feed(name, len(given), list(given.shape), dt, given)
            with pytest.raises(BadRequestError) as info:
                client.predict(req)
            assert info.value.code == 400, info.value
            refused(info.value.message, name, what)


@pytest.mark.parametrize("service", list(SERVICES))
def test_v1_form(gw: GatewayProcess, models: dict[str, Path], service: str) -> None:
    """KServe V1 (TensorFlow's default signature): one prediction per row, an object naming
    every output. Its JSON numbers carry no dtype (they are cast to the model's), so the wrong
    type a client can send is text; that, and a wrong shape, are a 400 naming the input."""
    runtime = SERVICES[service]
    name, outputs = MODELS[runtime][1], OUTPUTS[runtime]
    x = features(runtime, ROWS[runtime])
    wanted = want(models, service, x, "serving_default")
    status, body = post(gw, f"/v1/models/{service}:predict", {"instances": x.tolist()})
    assert status == 200, body
    assert len(body["predictions"]) == len(x), body
    for out in outputs:
        same(v1_output(body["predictions"], out, outputs), wanted[out], f"{service} v1 {out}")
    narrow, text = x[..., :-1], np.full(x.shape, "a")
    for rows, what in (
        (narrow, described(x.dtype.name, narrow.shape)),
        (text, described("string", text.shape)),
    ):
        status, body = post(gw, f"/v1/models/{service}:predict", {"instances": rows.tolist()})
        assert status == 400, body
        refused(body["error"], name, what)


@pytest.mark.parametrize("service", list(SERVICES))
def test_paddle_forms(gw: GatewayProcess, models: dict[str, Path], service: str) -> None:
    """Paddle's web service feed/fetch (one instance per row, stacked) and its pipeline's
    key/value form (one instance in a value's text), on TensorFlow's default signature: the
    library's numbers. Text for a number and a wrong shape are a 400 naming the input, in
    Paddle's error shape."""
    runtime = SERVICES[service]
    name, outputs = MODELS[runtime][1], OUTPUTS[runtime]
    x = features(runtime, ROWS[runtime])
    wanted = want(models, service, x, "serving_default")
    doc = {"feed": [{name: row} for row in x.tolist()], "fetch": [outputs[-1]]}
    status, body = post(gw, f"/{service}/prediction", doc)
    assert status == 200, body
    assert list(body["result"]) == [outputs[-1]]
    same(np.array(body["result"][outputs[-1]]), wanted[outputs[-1]], f"{service} paddle fetch")
    status, body = post(gw, f"/{service}/prediction", {"feed": [{name: row} for row in x.tolist()]})
    assert status == 200, body
    assert list(body["result"]) == list(outputs)
    for out in outputs:
        same(np.array(body["result"][out]), wanted[out], f"{service} paddle {out}")
    lone = want(models, service, x[:1], "serving_default")  # one row run alone: its own numbers
    status, body = post(gw, f"/{service}/prediction", {"key": [name], "value": [json.dumps(x[0].tolist())]})
    assert status == 200, body
    got = kv_outputs(body)
    assert list(got) == list(outputs)
    for out in outputs:
        same(got[out].reshape(lone[out].shape), lone[out], f"{service} key/value {out}")
    narrow, text = x[..., :-1], np.full(x.shape, "a")
    for rows, what in (
        (narrow, described(x.dtype.name, narrow.shape)),
        (text, described("string", text.shape)),
    ):
        status, body = post(gw, f"/{service}/prediction", {"feed": [{name: row} for row in rows.tolist()]})
        assert status == 400 and body["err_no"] == 400, body
        refused(body["err_msg"], name, what)
    doc = {"key": [name], "value": [json.dumps(narrow[0].tolist())]}
    status, body = post(gw, f"/{service}/prediction", doc)
    assert status == 400 and (body["err_no"], body["key"], body["value"]) == (400, [], []), body
    refused(body["err_msg"], name, described(x.dtype.name, (1, *narrow.shape[1:])))


def test_v2_json_and_many_calls_at_once(gw: GatewayProcess, models: dict[str, Path]) -> None:
    """Calls at once on the batched services: each gets its own rows' answers."""

    def one(i: int) -> None:
        service = BATCHED[i % 3]
        runtime = SERVICES[service]
        x = features(runtime, 1 + i % 2, seed=i)
        wanted = want(models, service, x, "serving_default")
        name, datatype = MODELS[runtime][1], "FP32" if x.dtype == np.float32 else "FP64"
        doc = {"inputs": [{"name": name, "shape": list(x.shape), "datatype": datatype,
                           "data": x.ravel().tolist()}]}  # fmt: skip
        status, body = post(gw, f"/v2/models/{service}/infer", doc, GUIDE_TOKENS.get(service, TOKEN))
        assert status == 200, body
        for out in body["outputs"]:
            got = np.array(out["data"]).reshape(out["shape"])
            same(got, wanted[out["name"]], f"{service} #{i} {out['name']}")

    with ThreadPoolExecutor(9) as pool:
        list(pool.map(one, range(18)))


@pytest.mark.parametrize("service", ["pytorch_gpu_wl", "tensorflow-thread", "scorecard_pmml_example"])
def test_wrong_dtype_or_shape_is_a_400_naming_the_input(gw: GatewayProcess, service: str) -> None:
    runtime = SERVICES[service]
    x = features(runtime, 1)
    name = MODELS[runtime][1]
    token = GUIDE_TOKENS.get(service, TOKEN)
    other = "FP32" if x.dtype == np.float64 else "FP64"
    doc = {"inputs": [{"name": name, "shape": list(x.shape), "datatype": other, "data": x.ravel().tolist()}]}
    status, body = post(gw, f"/v2/models/{service}/infer", doc, token)
    assert status == 400 and f"input {name!r}" in body["error"], body
    narrow = np.ascontiguousarray(x[..., :-1])
    dt = TFRequest.DT_FLOAT if x.dtype == np.float32 else TFRequest.DT_DOUBLE
    with PredictClient(gw.url, service, token=token) as client:
        req = TFRequest(TF_SIGNATURE)
        req.add_feed(name, list(narrow.shape), dt, narrow)
        with pytest.raises(BadRequestError) as info:
            client.predict(req)
        assert info.value.code == 400 and f"input {name!r}" in str(info.value), info.value
        ok = TFRequest(TF_SIGNATURE)
        ok.add_feed(name, list(x.shape), dt, x)
        assert client.predict(ok).to_numpy(OUTPUTS[runtime][1]).shape[0] == 1  # still serving


def test_pmml_record_without_a_field_is_a_400_naming_it(gw: GatewayProcess) -> None:
    with PredictClient(gw.url, "scorecard_pmml_example", token=TOKEN) as client:
        with pytest.raises(BadRequestError) as info:
            client.predict(StringRequest('[{"fea1": 1}]'))
    assert "input 'fea2'" in str(info.value)


def test_pipeline_step(gw: GatewayProcess, models: dict[str, Path]) -> None:
    x = features("pmml", 4)
    wanted = want(models, "pmml", x)
    with PredictClient(gw.url, "scorecard-pipeline", token=TOKEN) as client:
        req = TFRequest("serving_default")
        req.add_feed("x", list(x.shape), TFRequest.DT_DOUBLE, x)
        resp = client.predict(req)
    same(resp.to_numpy("proba"), wanted["predict_proba"], "pipeline proba")
    same(resp.to_numpy("label"), wanted["predict"], "pipeline label")


def test_own_model_steps_give_their_library_s_numbers(gw: GatewayProcess, models: dict[str, Path]) -> None:
    given = {"net": features("torch", 1), "mnist": features("tensorflow"), "score": features("pmml", 4)}
    with PredictClient(gw.url, "dl-pipeline", token=TOKEN) as client:
        req = TFRequest("serving_default")
        req.add_feed("image", list(given["net"].shape), TFRequest.DT_FLOAT, given["net"])
        req.add_feed("pixels", list(given["mnist"].shape), TFRequest.DT_FLOAT, given["mnist"])
        req.add_feed("x", list(given["score"].shape), TFRequest.DT_DOUBLE, given["score"])
        resp = client.predict(req)
    for step, runtime in OWN_MODEL_STEPS.items():
        wanted = want(models, runtime, given[step], "serving_default")
        for out in OUTPUTS[runtime]:
            same(resp.to_numpy(f"{step}_{out}"), wanted[out], f"dl-pipeline {step}.{out}")


def test_own_model_steps_run_where_they_are_placed(gw: GatewayProcess) -> None:
    # Each step's runs are listed as workers: the gateway's own pid for the step in its
    # threads, a process of its own for each other.
    workers = gw.services()["dl-pipeline"]["workers"]
    assert sorted(w["step"] for w in workers) == sorted(OWN_MODEL_STEPS), workers
    pids = {w["step"]: w["pid"] for w in workers}
    assert pids["net"] == gw.pid, workers
    assert gw.pid not in (pids["mnist"], pids["score"]) and pids["mnist"] != pids["score"], workers


GUIDE = ROOT / "samples" / "runtimes"
GUIDE = ROOT / "samples" / "runtimes"


@pytest.mark.compat
@pytest.mark.parametrize("demo", ["pmml", "tf", "torch"])
def test_the_guides_demos_run_unchanged(gw: GatewayProcess, models: dict[str, Path], demo: str) -> None:
    calls = 10 if demo == "torch" else 2  # the PyTorch demo's loop is 10 calls; the others' a million
    code = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    proc = run_reference(code, str(GUIDE / "run_guide_demo.py"), str(GUIDE / "eas_guide" / f"{demo}_demo.py"),
                         gw.url, "--calls", str(calls), timeout=120)  # fmt: skip
    lines = proc.stdout.decode().strip().splitlines()
    assert lines[-1] == f"== {calls} prediction(s) made", lines[-5:]
    if demo == "pmml":  # the guide prints each StringResponse: the records the model gives
        wanted = want(models, "pmml", np.array([[1.0, 2.0]]))
        row = json.loads(ast.literal_eval(lines[0]))[0]  # the repr of the body's bytes
        assert row["y"] == wanted["predict"][0]
        same(np.array([row["probability(0)"], row["probability(1)"]]), wanted["predict_proba"][0], "demo")
    elif demo == "tf":  # each TFResponse as protobuf's text: the guide's input is 784 ones
        wanted = want(models, "tensorflow", np.ones((1, 784), np.float32))
        text = proc.stdout.decode()
        assert text.count('key: "scores"') == calls
        assert text.count(f"int64_val: {wanted['classes'][0]}") == calls
    else:  # the guide prints the shape of output 0, then the average time
        assert lines[:10] == ["[1, 10]"] * 10, lines
        assert lines[10].startswith("average response time: ")


REFERENCE_CODE = r"""
import json, sys
import numpy as np
from eas_prediction import PredictClient, StringRequest, TFRequest, TorchRequest
endpoint, token, calls = sys.argv[1], sys.argv[2], json.loads(sys.stdin.read())
out = {}
for service, (kind, values, shape) in calls.items():
    client = PredictClient(endpoint, service)
    client.set_token(token)
    client.init()
    flat = np.asarray(values).ravel().tolist()
    if kind == "torch":
        req = TorchRequest()
        req.add_feed(0, shape, TorchRequest.DT_FLOAT, flat)
        resp = client.predict(req)
        out[service] = {str(i): list(resp.get_values(i)) for i in (0, 1)}
    elif kind == "tensorflow":
        req = TFRequest("predict_images")
        req.add_feed("images", shape, TFRequest.DT_FLOAT, flat)
        resp = client.predict(req)
        out[service] = {n: list(resp.get_values(n)) for n in ("scores", "classes")}
    else:
        rows = [{"fea1": a, "fea2": b} for a, b in values]
        out[service] = json.loads(client.predict(StringRequest(json.dumps(rows))).response_data)
    client.destroy()
print(json.dumps(out))
"""


@pytest.mark.compat
def test_reference_client(gw: GatewayProcess, models: dict[str, Path]) -> None:
    given = {"torch-thread": features("torch", 1), "mnist_saved_model_example": features("tensorflow"),
             "pmml-thread": features("pmml", 4)}  # fmt: skip
    calls = {s: (SERVICES[s], x.tolist(), list(x.shape)) for s, x in given.items()}
    given_bytes = json.dumps(calls).encode()  # an image is too long for a command line
    proc = run_reference(REFERENCE_CODE, gw.endpoint, TOKEN, timeout=60, input_bytes=given_bytes)
    result = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    for service, x in given.items():
        wanted = want(models, service, x)
        got = result[service]
        if SERVICES[service] == "torch":
            same(np.array(got["0"]).reshape(wanted["output__0"].shape), wanted["output__0"], service)
            same(np.array(got["1"]), wanted["output__1"], service)
        elif SERVICES[service] == "tensorflow":
            for name in ("scores", "classes"):
                same(np.array(got[name]).reshape(wanted[name].shape), wanted[name], f"{service} {name}")
        else:
            assert [r["y"] for r in got] == wanted["predict"].tolist()
            proba = np.array([[r["probability(0)"], r["probability(1)"]] for r in got])
            same(proba, wanted["predict_proba"], service)


@pytest.mark.compat
def test_tritonclient_http_and_grpc(
    gw: GatewayProcess, models: dict[str, Path], grpc_port: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = tmp_path_factory.mktemp("triton-runtimes")
    given = {"torch-thread": features("torch", 1), "tensorflow-thread": features("tensorflow"),
             "pmml-thread": features("pmml", 4)}  # fmt: skip
    np.savez(out / "in.npz", **given)
    grpc = f"127.0.0.1:{grpc_port}"
    run_client(".venv-clients", "triton_estimators.py", f"127.0.0.1:{gw.port}", grpc, TOKEN,
               str(out / "in.npz"), str(out), timeout=120)  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    with np.load(out / "arrays.npz", allow_pickle=False) as arrays:
        got = dict(arrays)
    for service, x in given.items():
        runtime = SERVICES[service]
        wanted = want(models, service, x, "serving_default")
        res = results[service]
        assert res["metadata"]["platform"] == PLATFORMS[runtime]
        assert [o["name"] for o in res["grpc_metadata"]["outputs"]] == list(OUTPUTS[runtime])
        for call in ("binary", "json", "grpc"):
            for name in OUTPUTS[runtime]:
                same(got[f"{service}.{call}.{name}"], wanted[name], f"{service} {call} {name}")
        name = MODELS[runtime][1]
        assert res["wrong_dtype"].startswith("400") and f"input {name!r}" in res["wrong_dtype"], res
