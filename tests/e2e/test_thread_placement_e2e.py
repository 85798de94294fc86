"""An onnx service whose model runs in the gateway's threads (``placement: thread``), through
the real gateway: every protocol gets the answer the same model gives on a worker process
(EAS TF and JSON, KServe V2 JSON and binary, V1, V2 gRPC), readiness and a broken model's
reason as for worker services, discovery points direct clients at the gateway, and an update
through the admin API swaps the sessions under load with no failed call. With no
``placement`` (``auto``) an onnx service runs there too, and in worker processes once it asks
for what only they give."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml

from eas_sdk import PredictClient, QueueClient, TFRequest
from gateway._proto import grpc_service_pb2 as pb
from gateway._proto import grpc_service_pb2_grpc as pb_grpc
from tests.e2e.gateway_proc import GatewayProcess, raw_post
from tests.e2e.reference_load import ReferenceLoad
from tests.e2e.test_services_e2e import ADMIN_TOKEN, cli

TOKEN = "e2e-thread-placement-token-4b1d"
AUTH = {"Authorization": TOKEN}
X = (np.arange(64, dtype=np.float32).reshape(1, 64) % 17) / 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("gw-thread")
    broken = workdir / "broken.onnx"
    broken.write_bytes(b"this is not an onnx model")
    common = {"token": TOKEN, "processor": "onnx"}
    config = {
        "admin": {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN},
        "gateway": {"worker_start_timeout_s": 30, "grpc_port": _free_port(), "shutdown_timeout_s": 5},
        "services": [
            {"name": "digits", "model": str(digits_model), "placement": "process", **common},
            # No placement: auto chooses, threads unless the service asks for worker processes.
            {"name": "adigits", "model": str(digits_model), **common},
            {"name": "mdigits", "model": str(digits_model), **common},
            {
                "name": "sdigits",
                "model": str(digits_model),
                "autoscale": {"min_workers": 1, "max_workers": 2},
                **common,
            },
            {"name": "tdigits", "model": str(digits_model), "placement": "thread", **common},
            {"name": "tbroken", "model": str(broken), "placement": "thread", **common},
            {"name": "atdigits", "model": str(digits_model), "placement": "thread", "async": True, **common},
        ],
    }
    proc = GatewayProcess.start(config, workdir)
    try:
        for name in ("digits", "adigits", "mdigits", "sdigits", "tdigits", "atdigits"):
            proc.wait_workers_ready(name, 1)
        yield proc
    finally:
        proc.kill()


def _post(
    gw: GatewayProcess, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    return raw_post(gw.port, path, body, {**AUTH, **headers})


def _get(gw: GatewayProcess, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        conn.request("GET", path, headers=AUTH)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _answers(gw: GatewayProcess, service: str) -> dict[str, tuple[int, list[float]]]:
    """(label, probabilities) of the same row by every protocol."""
    out: dict[str, tuple[int, list[float]]] = {}
    client = PredictClient(gw.endpoint, service)
    client.set_token(TOKEN)
    client.init()
    try:
        req = TFRequest("serving_default")
        req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, X)
        resp = client.predict(req)
        out["eas_tf"] = (int(resp.get_values("label")[0]), list(resp.get_values("probabilities")))
    finally:
        client.destroy()
    body = json.dumps({"inputs": {"input": X.tolist()}}).encode()
    status, _, data = _post(gw, f"/api/predict/{service}", body, {"Content-Type": "application/json"})
    assert status == 200, data
    doc = json.loads(data)["outputs"]
    out["eas_json"] = (int(doc["label"]["data"][0]), doc["probabilities"]["data"])
    v2 = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": X.ravel().tolist()}]}
    status, _, data = _post(gw, f"/v2/models/{service}/infer", json.dumps(v2).encode(), {})
    assert status == 200, data
    outputs = {o["name"]: o["data"] for o in json.loads(data)["outputs"]}
    out["v2_json"] = (int(outputs["label"][0]), outputs["probabilities"])
    head = json.dumps(
        {
            "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                        "parameters": {"binary_data_size": 256}}],
            "outputs": [{"name": "label"}, {"name": "probabilities", "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    status, headers, data = _post(
        gw, f"/v2/models/{service}/infer", head + X.astype("<f4").tobytes(),
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))},
    )  # fmt: skip
    assert status == 200, data
    n = int(headers["inference-header-content-length"])
    outputs = {o["name"]: o for o in json.loads(data[:n])["outputs"]}
    probabilities = np.frombuffer(data[n:], dtype="<f4").tolist()
    out["v2_binary"] = (int(outputs["label"]["data"][0]), probabilities)
    body = json.dumps({"instances": X.tolist()}).encode()
    status, _, data = _post(gw, f"/v1/models/{service}:predict", body, {})
    assert status == 200, data
    prediction = json.loads(data)["predictions"][0]
    out["v1"] = (int(prediction["label"]), prediction["probabilities"])
    port = yaml.safe_load((gw.workdir / "services.yaml").read_text())["gateway"]["grpc_port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        req = pb.ModelInferRequest(model_name=service)
        req.inputs.add(name="input", datatype="FP32", shape=[1, 64])
        req.raw_input_contents.append(X.astype("<f4").tobytes())
        answer = stub.ModelInfer(req, metadata=(("authorization", TOKEN),), timeout=10)
    raw = {o.name: blob for o, blob in zip(answer.outputs, answer.raw_output_contents, strict=True)}
    out["grpc"] = (
        int(np.frombuffer(raw["label"], "<i8")[0]),
        np.frombuffer(raw["probabilities"], "<f4").tolist(),
    )
    return out


def test_every_protocol_gets_the_worker_process_answer(gw: GatewayProcess) -> None:
    on_thread, on_process = _answers(gw, "tdigits"), _answers(gw, "digits")
    assert set(on_thread) == {"eas_tf", "eas_json", "v2_json", "v2_binary", "v1", "grpc"}
    for protocol, (label, probabilities) in on_thread.items():
        want_label, want_probabilities = on_process[protocol]
        assert label == want_label, protocol
        np.testing.assert_allclose(probabilities, want_probabilities, rtol=1e-6, err_msg=protocol)
    # A bad call is refused as a worker refuses it: the same status and message.
    bad = {"inputs": [{"name": "input", "shape": [1, 10], "datatype": "FP32", "data": [0.0] * 10}]}
    answers = [
        _post(gw, f"/v2/models/{s}/infer", json.dumps(bad).encode(), {}) for s in ("tdigits", "digits")
    ]
    assert answers[0][0] == answers[1][0] == 400
    assert json.loads(answers[0][2]) == json.loads(answers[1][2])


def test_an_asynchronous_service_answers_through_its_queues(gw: GatewayProcess) -> None:
    q, sink = QueueClient(gw.endpoint, "atdigits"), QueueClient(gw.endpoint, "atdigits/sink")
    for client in (q, sink):
        client.set_token(TOKEN)
        client.init()
    try:
        _index, rid = q.put(json.dumps({"inputs": {"input": X.tolist()}}).encode())
        frames = []
        deadline = time.monotonic() + 20
        while not frames and time.monotonic() < deadline:
            frames = sink.get(request_id=rid, length=1, timeout="2s")
    finally:
        q.close()
        sink.close()
    assert frames and frames[0].tags["status"] == "200"
    label = json.loads(bytes(frames[0].data))["outputs"]["label"]["data"][0]
    assert label == _answers(gw, "digits")["eas_json"][0]


def test_readiness_status_metrics_and_discovery(gw: GatewayProcess) -> None:
    services = gw.services()
    [session] = services["tdigits"]["workers"]
    assert session["state"] == "ready" and session["pid"] == gw.pid and session["http_port"] is None
    assert _get(gw, "/v2/models/tdigits/ready")[0] == 200
    # A model that does not load: not ready, with the reason, as a worker service.
    assert not services["tbroken"]["ready"]
    assert _get(gw, "/v2/models/tbroken/ready")[0] != 200
    status, _, data = _post(gw, "/api/predict/tbroken", b"{}", {"Content-Type": "application/json"})
    assert status == 503 and "its model failed to load" in json.loads(data)["message"]
    assert str(gw.workdir) not in data.decode()
    status, data = _get(gw, "/metrics")
    assert status == 200
    assert 'easgw_ready_workers{service="tdigits"} 1.0' in data.decode()
    assert 'easgw_ready_workers{service="tbroken"} 0.0' in data.decode()
    # Direct-mode clients are pointed at the gateway itself: there is no worker to call.
    status, data = _get(gw, "/api/v1/servicediscovery/upstreams/tdigits")
    assert status == 200
    assert json.loads(data)["endpoints"]["items"] == [{"ip": "127.0.0.1", "port": gw.port, "weight": 100}]


def test_an_update_swaps_the_sessions_with_no_failed_call(gw: GatewayProcess, digits_model: Path) -> None:
    spec = gw.workdir / "tdigits.yaml"
    doc = {
        "name": "tdigits", "processor": "onnx", "token": TOKEN, "model": str(digits_model),
        "placement": "thread", "intra_op_threads": 2,
    }  # fmt: skip
    load = ReferenceLoad.start(gw.endpoint, "tdigits", gw.workdir, token=TOKEN)
    try:
        spec.write_text(yaml.safe_dump(doc))
        rolled = cli(gw, "services", "update", "-f", str(spec))  # a new session: it rolls
        assert rolled.returncode == 0, rolled.stderr
        scaled = cli(gw, "services", "scale", "tdigits", "2")  # in place
        assert scaled.returncode == 0 and "(2/2 ready)" in scaled.stdout, scaled.stderr
        assert cli(gw, "services", "scale", "tdigits", "1").returncode == 0
        load.wait_calls(50)  # calls on the new version too
    finally:
        result = load.finish()
    assert result["failed"] == [], result["failed"][:5]
    assert result["ok"] > 50
    now = gw.services()["tdigits"]
    assert now["ready"] and [w["state"] for w in now["workers"]] == ["ready"]
    described = cli(gw, "services", "get", "tdigits")
    assert described.returncode == 0 and "thread" in described.stdout, described.stdout


def _described(gw: GatewayProcess, name: str) -> dict[str, Any]:
    got = cli(gw, "services", "get", name)
    assert got.returncode == 0, got.stderr
    return dict(json.loads(got.stdout))


def test_a_default_onnx_service_runs_in_the_gateways_threads(gw: GatewayProcess) -> None:
    services = gw.services()
    # No worker process: the one session is the gateway's; autoscale asks for worker processes.
    assert [w["pid"] for w in services["adigits"]["workers"]] == [gw.pid]
    assert gw.pid not in [w["pid"] for w in services["sdigits"]["workers"]]
    assert set(gw.worker_pids("sdigits")) <= set(gw.worker_pids())
    assert set(gw.worker_pids("digits")).isdisjoint([gw.pid])
    on_default, on_process = _answers(gw, "adigits"), _answers(gw, "digits")
    for protocol, (label, probabilities) in on_default.items():
        assert label == on_process[protocol][0], protocol
        np.testing.assert_allclose(probabilities, on_process[protocol][1], rtol=1e-6, err_msg=protocol)
    # The admin API and the status page say what auto chose, and why.
    default, scaled = _described(gw, "adigits"), _described(gw, "sdigits")
    assert default["placement"] == "thread" and "placement" not in default["spec"]
    assert "gateway's threads" in default["placement_reason"]
    assert (scaled["placement"], scaled["placement_reason"]) == (
        "process", "auto: autoscale needs worker processes"
    )  # fmt: skip
    assert _described(gw, "tdigits")["placement"] == "thread"
    assert "placement_reason" not in _described(gw, "tdigits")
    status, body = _get(gw, "/api/status")
    assert status == 200
    entries = {s["name"]: s for s in json.loads(body)["services"]}
    assert entries["adigits"]["placement"] == "thread" and entries["adigits"]["placement_reason"]
    assert (entries["digits"]["placement"], entries["digits"]["placement_reason"]) == ("process", None)


def test_scaling_a_service_auto_ran_in_threads_names_placement_process(gw: GatewayProcess) -> None:
    refused = cli(gw, "services", "scale", "adigits", "2")
    assert refused.returncode != 0
    assert "400" in refused.stderr or "BadRequest" in refused.stderr, refused.stderr
    assert "placement: process" in refused.stderr, refused.stderr
    assert [w["pid"] for w in gw.services()["adigits"]["workers"]] == [gw.pid]  # as it was


def test_an_update_asking_for_worker_processes_moves_the_model_with_no_failed_call(
    gw: GatewayProcess, digits_model: Path
) -> None:
    spec = gw.workdir / "mdigits.yaml"
    doc = {
        "name": "mdigits", "processor": "onnx", "token": TOKEN, "model": str(digits_model),
        "autoscale": {"min_workers": 1, "max_workers": 2},
    }  # fmt: skip
    load = ReferenceLoad.start(gw.endpoint, "mdigits", gw.workdir, token=TOKEN)
    try:
        load.wait_calls(20)  # calls on the threads first
        spec.write_text(yaml.safe_dump(doc))
        rolled = cli(gw, "services", "update", "-f", str(spec))
        assert rolled.returncode == 0, rolled.stderr
        load.wait_calls(20)  # and on the worker processes
    finally:
        result = load.finish()
    assert result["failed"] == [], result["failed"][:5]
    described = _described(gw, "mdigits")
    assert described["placement"] == "process"
    pids = [w["pid"] for w in described["workers"] if w["state"] == "ready"]
    assert pids and gw.pid not in pids
