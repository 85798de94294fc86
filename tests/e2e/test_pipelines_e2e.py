"""Pipelines on a real gateway with real workers: a transformer in front of a shared
predictor, fan-out and fan-in over model steps, the asynchronous (queue) mode, and config
errors as the command line reports them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from eas_sdk import ENDPOINT_TYPE_DIRECT, PredictClient, QueueClient, StringRequest
from eas_sdk.codecs.eas import decode_tf_response, encode_tf_request
from tests.e2e.gateway_proc import ROOT, GatewayProcess
from tests.e2e.pipeline_http import post, post_raw, sample_client, wait_ready

MODELS = ROOT / "samples" / "models"
SAMPLES = ROOT / "samples" / "pipelines"
OPS = Path(__file__).resolve().parent / "pipeline_ops.py"
PREDICTOR = Path(__file__).resolve().parent / "pipeline_predictor.py"


def _samples() -> dict[str, dict[str, Any]]:
    """The sample pipelines, their files named by absolute paths, in asynchronous mode."""
    found = {s["name"]: s for s in yaml.safe_load((SAMPLES / "pipelines.yaml").read_text())["services"]}
    reviews, digits = found["reviews"], found["digits-pipeline"]
    steps = reviews["pipeline"]["steps"]
    steps[0]["op"] = f"{SAMPLES / 'text_ops.py'}:Tokenize"
    steps[1]["model"] = str(MODELS / "text_classifier.onnx")
    steps = digits["pipeline"]["steps"]
    steps[0]["op"] = f"{SAMPLES / 'image_ops.py'}:DecodeImage"
    steps[1]["service"] = "features"  # the same model as the sample's digits-features
    steps[2]["model"] = str(MODELS / "digits_classifier.onnx")
    return {
        "reviews-async": {**reviews, "name": "reviews-async", "async": True},
        "digits-async": {**digits, "name": "digits-async", "async": True},
    }


def _services() -> list[dict[str, Any]]:
    return [
        {"name": "features", "processor": "onnx", "placement": "process", "public": True,
         "model": str(MODELS / "digits_features.onnx")},
        {   # a KServe-style transformer: preprocess -> the shared predictor -> postprocess, one step
            "name": "transformer",
            "processor": "pipeline", "public": True,
            "pipeline": {
                "inputs": {"pixels": {"dtype": "float32", "shape": [-1, 64]}},
                "steps": [{
                    "name": "around", "op": f"{OPS}:AroundFeatures", "service": "features",
                    "config": {"factor": 0.5}, "inputs": {"pixels": "request.pixels"},
                    "outputs": {"features": "float32", "norm": "float32"},
                }],
                "outputs": {"features": "around.features", "norm": "around.norm"},
            },
        },
        {"name": "scores", "processor": "python", "public": True,  # a user's Python predictor
         "entry": f"{PREDICTOR}:ScorePredictor", "config": {"threshold": 1.0}},
        {   # a transformer in front of it: the model step speaks the predictor's JSON form
            "name": "py-transformer",
            "processor": "pipeline", "public": True,
            "pipeline": {
                "inputs": {"x": "float32"},  # no shape: the predictor checks it
                "steps": [{
                    "name": "score", "op": f"{OPS}:AroundScore", "service": "scores",
                    "inputs": {"x": "request.x"}, "outputs": {"score": "float32", "label": "bytes"},
                }],
                "outputs": {"score": "score.score", "label": "score.label"},
            },
        },
        {"name": "echo", "processor": "python", "public": True,  # answers its body: not the JSON form
         "entry": f"{ROOT / 'samples' / 'processors' / 'echo.py'}:EchoProcessor"},
        {
            "name": "echoed",
            "processor": "pipeline", "public": True,
            "pipeline": {
                "inputs": {"x": "float32"},
                "steps": [{"name": "echo", "service": "echo", "inputs": {"x": "request.x"},
                           "outputs": ["y"]}],
                "outputs": {"y": "echo.y"},
            },
        },
        {   # fan-out after the features, fan-in in a concat
            "name": "fan",
            "processor": "pipeline", "public": True,
            "pipeline": {
                "inputs": {"pixels": {"dtype": "float32", "shape": [-1, 64]}},
                "steps": [
                    {"name": "features", "service": "features", "inputs": {"pixels": "request.pixels"},
                     "outputs": ["features"]},
                    {"name": "classify", "model": str(MODELS / "digits_classifier.onnx"),
                     "inputs": {"features": "features.features"}, "outputs": ["probabilities"]},
                    {"name": "soft", "transform": "softmax", "inputs": {"x": "features.features"},
                     "outputs": ["y"]},
                    {"name": "join", "transform": "concat",
                     "inputs": {"p": "classify.probabilities", "s": "soft.y"}, "outputs": ["y"]},
                ],
                "outputs": {"joined": "join.y"},
            },
        },
        {   # no shape declared: the model step is the one to check it
            "name": "loose",
            "processor": "pipeline", "public": True,
            "pipeline": {
                "inputs": {"pixels": "float32"},
                "steps": [{"name": "features", "service": "features", "inputs": {"pixels": "request.pixels"},
                           "outputs": ["features"]}],
                "outputs": {"features": "features.features"},
            },
        },
        {   # names the model does not have: the config's fault, found on the first call
            "name": "misnamed",
            "processor": "pipeline", "public": True,
            "pipeline": {
                "inputs": {"pixels": "float32"},
                "steps": [{"name": "features", "service": "features", "inputs": {"pixel": "request.pixels"},
                           "outputs": ["features"]}],
                "outputs": {"features": "features.features"},
            },
        },
        {   # an op on worker processes of its own
            "name": "procop",
            "processor": "pipeline", "public": True,
            "pipeline": {
                "inputs": {"x": "float32"},
                "steps": [
                    {"name": "work", "op": f"{OPS}:InWorker", "placement": "process", "workers": 1,
                     "inputs": {"x": "request.x"},
                     "outputs": {"y": "float32", "pid": "int64", "label": "bytes", "info": None,
                                 "mapped": "bool"}},
                    {"name": "describe", "op": f"{OPS}:Describe",
                     "inputs": {"info": "work.info", "label": "work.label"}, "outputs": {"summary": "bytes"}},
                ],
                "outputs": {"y": "work.y", "pid": "work.pid", "label": "work.label",
                            "summary": "describe.summary", "info": "work.info", "mapped": "work.mapped"},
            },
        },
        *_samples().values(),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    subprocess.run(
        [sys.executable, str(SAMPLES / "build_models.py")],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        grpc_port = s.getsockname()[1]
    config = {"gateway": {"grpc_port": grpc_port}, "services": _services()}
    proc = GatewayProcess.start(config, tmp_path_factory.mktemp("pipelines"))
    try:
        wait_ready(proc)
        yield proc
    finally:
        assert proc.stop() == 0, proc.output()[-3000:]


def _pixels(n: int) -> np.ndarray:
    return np.random.default_rng(n).random((n, 64), dtype=np.float32)


def _inference_count(gw: GatewayProcess, model: str) -> int:
    status, body = gw.get_json(f"/v2/models/{model}/stats")
    assert status == 200, body
    return int(body["model_stats"][0]["inference_count"])


def _runs(gw: GatewayProcess, service: str) -> int:
    return sum(int(w.get("runs") or 0) for w in gw.services()[service]["workers"])


def _features_runs(gw: GatewayProcess) -> int:
    return _runs(gw, "features")


def test_a_transformer_in_front_of_a_shared_predictor(gw: GatewayProcess) -> None:
    pixels = _pixels(2)
    status, direct, _ = post(gw, "/api/predict/features", {"inputs": {"pixels": (pixels * 0.5).tolist()}})
    assert status == 200, direct
    runs_before = _features_runs(gw)
    counted_before = _inference_count(gw, "features")
    status, body, _ = post(gw, "/api/predict/transformer", {"inputs": {"pixels": pixels.tolist()}})
    assert status == 200, body
    # The predictor's statistics count the pipeline's call beside its own callers'.
    assert _inference_count(gw, "features") == counted_before + 1
    features = np.reshape(body["outputs"]["features"]["data"], (2, 16))
    want = np.reshape(direct["outputs"]["features"]["data"], (2, 16))
    np.testing.assert_allclose(features, want, rtol=1e-5)
    np.testing.assert_allclose(body["outputs"]["norm"]["data"], np.linalg.norm(want, axis=1), rtol=1e-5)
    # The pipeline's call ran on the predictor's own worker (its run count, from the health ping).
    deadline = time.monotonic() + 5
    while _features_runs(gw) <= runs_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _features_runs(gw) > runs_before
    assert gw.services()["transformer"].get("workers", []) == []  # no model copy of its own


def test_a_transformer_in_front_of_a_python_predictor(gw: GatewayProcess) -> None:
    x = [[0.25, 0.25], [1.0, 1.0]]
    status, direct, _ = post(
        gw,
        "/api/predict/scores",
        {"inputs": {"x": {"shape": [2, 2], "dtype": "float32", "data": [0.5, 0.5, 2.0, 2.0]}}},
    )
    assert status == 200 and direct["outputs"]["label"]["data"] == ["low", "high"], direct
    runs_before = _runs(gw, "scores")
    status, body, _ = post(gw, "/api/predict/py-transformer", {"inputs": {"x": x}})
    assert status == 200, body
    assert body["outputs"]["score"] == {"dtype": "float32", "shape": [2], "data": [1.0, 4.0]}
    assert body["outputs"]["label"]["data"] == ["low!", "high!"]
    # The call ran on the predictor's own worker (its run count, from the health ping).
    deadline = time.monotonic() + 5
    while _runs(gw, "scores") <= runs_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _runs(gw, "scores") > runs_before
    # Through V2 as well, its outputs typed from the predictor's metadata and the config.
    v2 = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [2.0, 0.5]}]}
    status, body, _ = post(gw, "/v2/models/py-transformer/infer", v2)
    assert status == 200, body
    got = {o["name"]: (o["datatype"], o["data"]) for o in body["outputs"]}
    assert got == {"score": ("FP32", [5.0]), "label": ("BYTES", ["high!"])}
    # The predictor's own refusal names the step, with its status.
    status, body, _ = post(gw, "/api/predict/py-transformer", {"inputs": {"x": [1.0, 2.0]}})
    assert status == 400, body
    assert body["message"].startswith("step 'score': x: expected float32[N,M], got float32[2]"), body
    # A Python service that does not answer in the JSON form fails the step with a 502.
    status, body, _ = post(gw, "/api/predict/echoed", {"inputs": {"x": [1.0]}})
    assert status == 502 and body["message"].startswith(
        "step 'echo': the model's reply is not an answer in the JSON form"
    ), body


def test_direct_mode_reaches_a_pipeline_at_its_gateway(gw: GatewayProcess) -> None:
    """Discovery publishes the gateway itself for a pipeline (it runs there), so the SDK in
    direct mode calls it like any service; a model service still lists its workers."""
    status, doc = gw.get_json("/api/v1/servicediscovery/upstreams/transformer")
    assert status == 200 and [(i["ip"], i["port"]) for i in doc["endpoints"]["items"]] == [
        ("127.0.0.1", gw.port)
    ]
    status, workers = gw.get_json("/api/v1/servicediscovery/upstreams/features")
    assert status == 200 and all(i["port"] != gw.port for i in workers["endpoints"]["items"])
    pixels = _pixels(2)
    with PredictClient(gw.endpoint, "transformer", endpoint_type=ENDPOINT_TYPE_DIRECT) as client:
        body = json.loads(
            client.predict(StringRequest(json.dumps({"inputs": {"pixels": pixels.tolist()}}))).response_data
        )
    assert np.reshape(body["outputs"]["features"]["data"], (2, 16)).shape == (2, 16)


def test_fan_out_and_fan_in_over_model_steps(gw: GatewayProcess) -> None:
    status, body, headers = post(
        gw, "/api/predict/fan", {"inputs": {"pixels": _pixels(3).tolist()}}, {"X-Eas-Pipeline-Timings": "yes"}
    )
    assert status == 200, body
    joined = np.reshape(body["outputs"]["joined"]["data"], body["outputs"]["joined"]["shape"])
    assert joined.shape == (3, 26)  # ten class probabilities, then sixteen softmaxed features
    np.testing.assert_allclose(joined[:, :10].sum(axis=1), 1.0, rtol=1e-4)
    np.testing.assert_allclose(joined[:, 10:].sum(axis=1), 1.0, rtol=1e-4)
    timed = {part.split(";")[0] for part in headers["Server-Timing"].split(", ")}
    assert timed == {"features", "classify", "soft", "join", "total"}
    v2 = {
        "inputs": [
            {"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": _pixels(1).ravel().tolist()}
        ]
    }
    status, body, _ = post(gw, "/v2/models/fan/infer", v2)
    assert status == 200 and body["outputs"][0]["shape"] == [1, 26]


def test_a_pipeline_through_v2_grpc(gw: GatewayProcess) -> None:
    import grpc

    from gateway._proto import grpc_service_pb2 as pb
    from gateway._proto import grpc_service_pb2_grpc as pb_grpc

    port = yaml.safe_load((gw.workdir / "services.yaml").read_text())["gateway"]["grpc_port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="fan"), timeout=10)
        assert [(t.name, t.datatype) for t in meta.inputs] == [("pixels", "FP32")]
        req = pb.ModelInferRequest(model_name="fan")
        req.inputs.add(name="pixels", datatype="FP32", shape=[2, 64])
        req.raw_input_contents.append(_pixels(2).tobytes())
        resp = stub.ModelInfer(req, timeout=10)
        assert [(o.name, list(o.shape)) for o in resp.outputs] == [("joined", [2, 26])]
        joined = np.frombuffer(resp.raw_output_contents[0], dtype=np.float32).reshape(2, 26)
        np.testing.assert_allclose(joined[:, :10].sum(axis=1), 1.0, rtol=1e-4)


def _timed(headers: Any) -> set[str]:
    return {part.split(";")[0] for part in (headers.get("Server-Timing") or "").split(", ") if part}


def test_per_step_timings_on_v1_v2_and_grpc(gw: GatewayProcess) -> None:
    import grpc

    from gateway._proto import grpc_service_pb2 as pb
    from gateway._proto import grpc_service_pb2_grpc as pb_grpc

    steps = {"features", "classify", "soft", "join", "total"}
    asked = {"X-Eas-Pipeline-Timings": "1"}
    row = _pixels(1).ravel().tolist()
    v2 = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": row}]}
    status, body, headers = post(gw, "/v2/models/fan/infer", v2, asked)
    assert status == 200 and _timed(headers) == steps, (body, dict(headers))
    status, body, headers = post(gw, "/v1/models/fan:predict", {"instances": [row]}, asked)
    assert status == 200 and len(body["predictions"]) == 1 and _timed(headers) == steps
    for path, doc in (("/v2/models/fan/infer", v2), ("/v1/models/fan:predict", {"instances": [row]})):
        status, _, headers = post(gw, path, doc)  # not asked: not answered
        assert status == 200 and "Server-Timing" not in headers
    port = yaml.safe_load((gw.workdir / "services.yaml").read_text())["gateway"]["grpc_port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        req = pb.ModelInferRequest(model_name="fan")
        req.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
        req.raw_input_contents.append(_pixels(1).tobytes())
        _, call = stub.ModelInfer.with_call(req, timeout=10, metadata=[("x-eas-pipeline-timings", "1")])
        assert _timed(dict(call.trailing_metadata())) == set()  # gRPC keys are lowercase
        assert _timed({"Server-Timing": dict(call.trailing_metadata())["server-timing"]}) == steps
        _, call = stub.ModelInfer.with_call(req, timeout=10)
        assert "server-timing" not in dict(call.trailing_metadata())


def test_a_model_step_refusing_its_input_names_the_step(gw: GatewayProcess) -> None:
    # The pipeline's declared input shape turns a short row away before any step runs ...
    status, body, _ = post(gw, "/fan/prediction", {"feed": [{"pixels": [0.5] * 63}]})
    assert status == 400 and "expected float32[-1,64]" in body["err_msg"]
    # ... and a shape only the model checks fails at the model's step, with the model's status.
    status, body, _ = post(gw, "/api/predict/loose", {"inputs": {"pixels": [[0.5] * 63]}})
    assert status == 400 and body["code"] == "PipelineStepFailed"
    assert body["message"].startswith("step 'features': input 'pixels': expected float32[N,64]"), body
    status, body, _ = post(gw, "/api/predict/loose", {"inputs": {"pixels": [[0.5] * 64]}})
    assert status == 200
    # A step naming an input the model lacks is a 500 that says so, not the caller's 400.
    status, body, _ = post(gw, "/api/predict/misnamed", {"inputs": {"pixels": [[0.5] * 64]}})
    assert status == 500, body
    assert body["message"] == "step 'features': the model has no input 'pixel'; its inputs: pixels"


def test_an_op_on_worker_processes_of_its_own(gw: GatewayProcess) -> None:
    status, body, _ = post(gw, "/api/predict/procop", {"inputs": {"x": [1.5, 2.0]}})
    assert status == 200, body
    assert body["outputs"]["y"]["data"] == [3.0, 4.0]
    assert body["outputs"]["mapped"]["data"] == [False]  # small: in the message
    # Plain values cross the process boundary too: a string for the answer, and a dict
    # (with a tuple and bytes inside) that a later step reads as it was made.
    assert body["outputs"]["label"]["data"] == ["big"]
    assert body["outputs"]["summary"]["data"] == ["big: 2 values up to 2, raw 00ff"]
    # A dict in the answer is its JSON text (a tuple as a list, bytes as text).
    info = json.loads(body["outputs"]["info"]["data"][0])
    assert info == {"count": 2, "top": 2.0, "tags": ["a", ["b", 2]], "raw": "\x00\ufffd"}
    workers = gw.services()["procop"]["workers"]
    assert [(w["step"], w["pid"]) for w in workers] == [("work", body["outputs"]["pid"]["data"][0])]
    assert workers[0]["pid"] != gw.pid
    # A large array goes to the worker and back through the pipeline's shared memory, whose
    # files are gone once the call is over.
    x = np.random.default_rng(0).random(300_000, dtype=np.float32)  # 1.2 MB
    status, reply = post_raw(gw, "/api/predict/procop", encode_tf_request(None, {"x": x}, ["y", "mapped"]))
    assert status == 200, reply[:300]
    answer = decode_tf_response(reply)
    np.testing.assert_array_equal(answer["y"].to_tensor("y").array, x * 2)
    assert answer["mapped"].to_tensor("mapped").array.tolist() is True
    areas = list(Path("/dev/shm").glob("easkit-procop-*"))  # where the gateway puts them
    assert areas and not [f for a in areas for f in a.iterdir()]
    status, body, _ = post(gw, "/procop/prediction", {"feed": [{"x": -1.0}]})
    assert status == 422 and body["err_msg"] == "step 'work': x must not be negative"


def _through_queue(gw: GatewayProcess, service: str, bodies: list[bytes]) -> list[bytes]:
    """Put ``bodies`` on an asynchronous service's input queue; -> the results, in order."""
    queue = QueueClient(gw.url, service)
    queue.init()
    sent = [queue.put(body)[1] for body in bodies]
    sink = QueueClient(gw.url, f"{service}/sink")
    sink.init(uid="pipeline-test")
    watcher = sink.watch(0, 10, auto_commit=True)
    results: dict[str, bytes] = {}
    for record in watcher.run():
        assert record.tags.get("status", "200") == "200", record.data
        results[record.tags["requestId"]] = bytes(record.data)
        if len(results) == len(bodies):
            break
    watcher.close()
    return [results[rid] for rid in sent]


def test_the_text_pipeline_in_asynchronous_mode(gw: GatewayProcess) -> None:
    texts = ["excellent quality love it", "awful it broke", "the manual is in english"]
    results = _through_queue(
        gw, "reviews-async", [json.dumps({"inputs": {"text": [t]}}).encode() for t in texts]
    )
    assert [json.loads(r)["outputs"]["label"]["data"] for r in results] == [
        ["positive"],
        ["negative"],
        ["neutral"],
    ]


def test_the_image_pipeline_in_asynchronous_mode(gw: GatewayProcess) -> None:
    client = sample_client()
    DIGIT_NAMES, digit_pngs = client.DIGIT_NAMES, client.digit_pngs

    pngs, labels = digit_pngs(2)
    bodies = [
        encode_tf_request("serving_default", {"image": np.array([p], dtype=object)}, ["labels"]) for p in pngs
    ]
    results = _through_queue(gw, "digits-async", bodies)
    top1 = [decode_tf_response(r)["labels"].to_tensor("labels").array[0][0] for r in results]
    assert [t.decode() if isinstance(t, bytes) else t for t in top1] == [DIGIT_NAMES[i] for i in labels]


def _serve(tmp_path: Path, services: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"services": services}))
    return subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_config_errors_stop_the_start_naming_step_and_field(tmp_path: Path) -> None:
    services = _services()[:2]
    services[1]["pipeline"]["steps"][0]["inputs"] = {"pixels": "request.pixel"}
    proc = _serve(tmp_path, services)
    assert proc.returncode == 2
    assert (
        "services[1] (transformer).pipeline.steps[0] (around).inputs.pixels: no request input 'pixel'"
        in proc.stderr
    )
    # An op whose code cannot load is found at start, before any request.
    broken = tmp_path / "broken_ops.py"
    broken.write_text("import a_module_that_does_not_exist\n")
    services = _services()[:2]
    services[1]["pipeline"]["steps"][0]["op"] = f"{broken}:AroundFeatures"
    proc = _serve(tmp_path, services)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "start-up failed: service 'transformer': step 'around': cannot load op" in proc.stderr
    assert "a_module_that_does_not_exist" in proc.stderr
