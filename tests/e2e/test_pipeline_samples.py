"""The two sample pipelines (samples/pipelines/) as a user runs them: their models built
offline, ``pipelines.yaml`` loaded as it is, the sample client, and each pipeline called
through EAS (JSON and TF protobuf), KServe V2 and V1, Paddle Serving's two forms and
Cluster Serving's REST form."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from eas_sdk import PredictClient, StringRequest, TFRequest
from tests.e2e.gateway_proc import ROOT, GatewayProcess
from tests.e2e.pipeline_http import post, sample_client, wait_ready

SAMPLES = ROOT / "samples" / "pipelines"


_client = sample_client()
DIGIT_NAMES, digit_pngs = _client.DIGIT_NAMES, _client.digit_pngs


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    subprocess.run(
        [sys.executable, str(SAMPLES / "build_models.py")],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    proc = GatewayProcess.start(SAMPLES / "pipelines.yaml", tmp_path_factory.mktemp("pipeline-samples"))
    try:
        wait_ready(proc)
        yield proc
    finally:
        assert proc.stop() == 0, proc.output()[-3000:]


@pytest.fixture(scope="module")
def images() -> tuple[list[str], list[int]]:
    pngs, labels = digit_pngs(3)
    return [base64.b64encode(p).decode() for p in pngs], labels


def test_the_sample_client_succeeds(gw: GatewayProcess) -> None:
    proc = subprocess.run(
        [sys.executable, str(SAMPLES / "client.py"), "--endpoint", gw.url],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "both sample pipelines answered correctly" in proc.stdout


def test_image_pipeline_through_eas_tf_and_json(
    gw: GatewayProcess, images: tuple[list[str], list[int]]
) -> None:
    b64, labels = images
    with PredictClient(gw.url, "digits-pipeline") as client:
        request = TFRequest("serving_default")
        request.add_feed("image", [len(b64)], TFRequest.DT_STRING, [base64.b64decode(b) for b in b64])
        request.add_fetch("labels")
        response = client.predict(request)
        assert [v.decode() for v in response.to_numpy("labels")[:, 0]] == [DIGIT_NAMES[i] for i in labels]
        doc = {"inputs": {"image": b64}, "outputs": ["classes", "scores"]}
        reply = json.loads(client.predict(StringRequest(json.dumps(doc))).response_data)
    assert list(reply["outputs"]) == ["classes", "scores"]
    assert reply["outputs"]["classes"]["shape"] == [3, 3]
    scores = np.reshape(reply["outputs"]["scores"]["data"], (3, 3))
    assert (np.diff(scores, axis=1) <= 0).all()  # top-k: best first


def test_image_pipeline_through_kserve(gw: GatewayProcess, images: tuple[list[str], list[int]]) -> None:
    b64, labels = images
    status, meta = gw.get_json("/v2/models/digits-pipeline")
    assert status == 200
    assert meta["platform"] == "pipeline"
    assert meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
    assert {o["name"]: o["datatype"] for o in meta["outputs"]} == {
        "classes": "INT64", "scores": "FP32", "labels": "BYTES"  # scores: the classifier's type, through topk
    }  # fmt: skip
    v2 = {
        "inputs": [{"name": "image", "datatype": "BYTES", "shape": [2], "data": b64[:2]}],
        "outputs": [{"name": "labels"}],
    }
    status, body, _ = post(gw, "/v2/models/digits-pipeline/infer", v2)
    assert status == 200, body
    assert body["outputs"][0]["name"] == "labels" and body["outputs"][0]["shape"] == [2, 3]
    assert body["outputs"][0]["data"][::3] == [DIGIT_NAMES[i] for i in labels[:2]]
    status, body, _ = post(gw, "/v1/models/digits-pipeline:predict", {"instances": [{"image": b64[2]}]})
    assert status == 200, body
    assert body["predictions"][0]["classes"][0] == labels[2]


def test_image_pipeline_through_paddle(gw: GatewayProcess, images: tuple[list[str], list[int]]) -> None:
    b64, labels = images
    feed = {"feed": [{"image": b64[0]}, {"image": b64[1]}], "fetch": ["classes"]}
    status, body, _ = post(gw, "/digits-pipeline/prediction", feed)
    assert status == 200, body
    assert [row[0] for row in body["result"]["classes"]] == labels[:2]
    status, body, _ = post(
        gw, "/digits-pipeline/prediction", {"key": ["image"], "value": [b64[2]], "fetch": ["labels"]}
    )
    assert status == 200 and body["err_no"] == 0
    assert body["key"] == ["labels"] and json.loads(body["value"][0])[0][0] == DIGIT_NAMES[labels[2]]


TEXTS = ["great product love it", "terrible it broke after a day", "the box contains a cable"]
EXPECTED = ["positive", "negative", "neutral"]


def test_text_pipeline_through_every_protocol(gw: GatewayProcess) -> None:
    status, meta = gw.get_json("/v2/models/reviews")
    assert status == 200 and {o["name"]: o["datatype"] for o in meta["outputs"]} == {
        "label": "BYTES", "probabilities": "FP32"  # the in-process model's own output type
    }  # fmt: skip
    with PredictClient(gw.url, "reviews") as client:
        request = TFRequest("serving_default")
        request.add_feed("text", [3], TFRequest.DT_STRING, [t.encode() for t in TEXTS])
        response = client.predict(request)
    assert [v.decode() for v in response.to_numpy("label")] == EXPECTED
    assert response.to_numpy("probabilities").shape == (3, 3)
    v2 = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": TEXTS}]}
    status, body, _ = post(gw, "/v2/models/reviews/infer", v2)
    assert status == 200 and {o["name"]: o["data"] for o in body["outputs"]}["label"] == EXPECTED
    status, body, _ = post(gw, "/v1/models/reviews:predict", {"instances": [{"text": t} for t in TEXTS]})
    assert status == 200 and [p["label"] for p in body["predictions"]] == EXPECTED
    status, body, _ = post(
        gw, "/reviews/prediction", {"feed": [{"text": t} for t in TEXTS], "fetch": ["label"]}
    )
    assert status == 200 and body == {"result": {"label": EXPECTED}}
    status, body, _ = post(gw, "/reviews/prediction", {"key": ["text"], "value": [TEXTS[1]]})
    assert status == 200 and body["value"][body["key"].index("label")] == "negative"
    cs = {"instances": [{"text": t} for t in TEXTS]}
    status, body, _ = post(gw, "/api/cluster-serving/reviews/predict", cs)
    assert status == 200 and [p["label"] for p in body["predictions"]] == EXPECTED


def test_the_shared_feature_model_serves_its_own_callers(gw: GatewayProcess) -> None:
    from sklearn.datasets import load_digits

    pixels = (load_digits().data[:2] / 16.0).astype(np.float32)
    status, body, _ = post(
        gw, "/digits-features/prediction", {"feed": [{"pixels": p} for p in pixels.tolist()]}
    )
    assert status == 200 and np.asarray(body["result"]["features"]).shape == (2, 16)
    # The pipeline's "features" step runs on this service's workers: the pipeline has no
    # worker of its own for it, only for the step with its own model file.
    steps = {w["step"] for w in gw.services()["digits-pipeline"]["workers"]}
    assert steps == {"classify"}


def test_a_bad_image_fails_its_step_in_each_protocol(gw: GatewayProcess) -> None:
    not_an_image = base64.b64encode(b"hello").decode()
    status, body, _ = post(gw, "/api/predict/digits-pipeline", {"inputs": {"image": [not_an_image]}})
    assert status == 400 and body["code"] == "PipelineStepFailed"
    assert body["message"].startswith("step 'decode': image: cannot decode")
    v2 = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": [not_an_image]}]}
    status, body, _ = post(gw, "/v2/models/digits-pipeline/infer", v2)
    assert status == 400 and body["error"].startswith("step 'decode'")
    status, body, _ = post(gw, "/digits-pipeline/prediction", {"key": ["image"], "value": [not_an_image]})
    assert status == 400 and body["err_no"] == 400 and body["err_msg"].startswith("step 'decode'")
    # The pipeline keeps serving.
    status, body, _ = post(gw, "/reviews/prediction", {"feed": [{"text": TEXTS[0]}], "fetch": ["label"]})
    assert status == 200 and body["result"]["label"] == ["positive"]


def test_step_timings_in_the_answer_and_in_metrics(gw: GatewayProcess) -> None:
    doc = {"inputs": {"text": [TEXTS[0]]}}
    status, _, headers = post(gw, "/api/predict/reviews", doc, {"X-Eas-Pipeline-Timings": "1"})
    assert status == 200
    steps = [part.split(";")[0] for part in headers["Server-Timing"].split(", ")]
    assert steps == ["tokenize", "model", "best", "label", "total"]
    status, _, headers = post(gw, "/api/predict/reviews", doc)
    assert status == 200 and "Server-Timing" not in headers
    import urllib.request

    with urllib.request.urlopen(gw.url + "/metrics", timeout=5) as r:
        metrics = r.read().decode()
    counts = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("easgw_pipeline_step_seconds_count")
    }
    assert counts['service="reviews",step="tokenize"'] >= 2
    assert 'service="digits-pipeline",step="decode"' in counts


def test_the_sample_config_names_its_files_relative_to_itself() -> None:
    from gateway.config import load_config

    cfg = load_config(SAMPLES / "pipelines.yaml")
    pipeline = cfg.service("digits-pipeline")
    assert pipeline is not None and pipeline.pipeline is not None
    assert Path(pipeline.pipeline.step("classify").model or "").is_file()
