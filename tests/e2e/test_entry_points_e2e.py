"""The same bad calls through every way into a model get the same status and error shape.

Entry points: the gateway's lean front (a plain POST to a service's path), the aiohttp
predict route (the same call with a chunked body, which the lean front hands over), the
worker's direct port, the queue dispatcher of an asynchronous service (the result
record's status), KServe V2 and V1, Cluster Serving, and V2 gRPC. Cases: an unknown service, no
token, a wrong token, a malformed body, a processor that fails, and a service with no
ready worker. EAS-protocol answers carry ``{"code", "message", "request_id"}``; KServe
and Cluster Serving answers carry ``{"error"}``; the status is the same everywhere (over
gRPC: the code that means it, gateway/fronts/grpc/status.py).
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml

from eas_sdk import QueueClient
from gateway._proto import grpc_service_pb2 as pb
from gateway._proto import grpc_service_pb2_grpc as pb_grpc
from tests.e2e.gateway_proc import ECHO_ENTRY, GatewayProcess, raw_post
from tests.redis_server import free_port

TOKEN = "e2e-entry-points-token-5c1f0e7d"
AUTH = {"Authorization": TOKEN}
NO_AUTH: dict[str, str] = {}
BAD_AUTH = {"Authorization": "not-the-token"}
EAS_KEYS = {"code", "message", "request_id"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("gw-entry")
    broken = workdir / "broken.onnx"
    broken.write_bytes(b"this is not an onnx model")
    common = {"token": TOKEN, "workers": 1}
    config = {
        "gateway": {"worker_start_timeout_s": 30, "grpc_port": free_port()},
        "services": [
            {
                "name": "digits",
                "processor": "onnx",
                "placement": "process",
                "model": str(digits_model),
                **common,
            },
            {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, **common},
            {"name": "aecho", "processor": "python", "entry": ECHO_ENTRY, "async": True, **common},
            {"name": "adigits", "processor": "onnx", "model": str(digits_model), "async": True, **common},
            {"name": "broken", "processor": "onnx", "model": str(broken), **common},
        ],
    }
    proc = GatewayProcess.start(config, workdir)
    try:
        for name in ("digits", "echo", "aecho", "adigits"):
            proc.wait_workers_ready(name, 1)
        yield proc
    finally:
        proc.kill()


def _worker_port(gw: GatewayProcess, service: str) -> int:
    workers = gw.services()[service]["workers"]
    return int(next(w["http_port"] for w in workers if w["state"] == "ready"))


def _eas_shape(body: bytes) -> dict[str, Any]:
    doc = json.loads(body)
    assert set(doc) == EAS_KEYS, doc
    assert isinstance(doc["message"], str) and doc["message"]
    return doc


def _error_shape(body: bytes) -> str:
    doc = json.loads(body)
    assert set(doc) == {"error"}, doc
    assert isinstance(doc["error"], str) and doc["error"]
    return str(doc["error"])


def _eas_calls(gw: GatewayProcess, service: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    """One call through the lean front, the aiohttp route and the worker's direct port."""
    path = f"/api/predict/{service}"
    out = {
        "front": raw_post(gw.port, path, body, headers),
        "route": raw_post(gw.port, path, body, headers, chunked=True),
    }
    if service in ("digits", "echo"):
        out["direct"] = raw_post(_worker_port(gw, service), path, body, headers)
    return out


def _as_binary(body: bytes) -> tuple[bytes, str]:
    """A V2 JSON body in the binary tensor data extension (FP32 inputs' data as bytes after the
    JSON header); any other body as a header alone. -> (body, Inference-Header-Content-Length)."""
    try:
        doc = json.loads(body)
        inputs = doc["inputs"]
    except (ValueError, TypeError, KeyError):
        return body, str(len(body))
    raw = b""
    for t in inputs:
        if isinstance(t, dict) and t.get("datatype") == "FP32" and isinstance(t.get("data"), list):
            data = struct.pack(f"<{len(t['data'])}f", *t.pop("data"))
            t["parameters"] = {"binary_data_size": len(data)}
            raw += data
    header = json.dumps(doc).encode()
    return header + raw, str(len(header))


def _json_calls(gw: GatewayProcess, model: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    hdrs = {"Content-Type": "application/json", **headers}
    binary, header_length = _as_binary(body)
    return {
        "v2": raw_post(gw.port, f"/v2/models/{model}/infer", body, hdrs),
        "v2_binary": raw_post(
            gw.port,
            f"/v2/models/{model}/infer",
            binary,
            {**hdrs, "Inference-Header-Content-Length": header_length},
        ),
        "v1": raw_post(gw.port, f"/v1/models/{model}:predict", body, hdrs),
        "cluster_serving": raw_post(gw.port, f"/api/cluster-serving/{model}/predict", body, hdrs),
    }


def _async_result(gw: GatewayProcess, service: str, body: bytes) -> tuple[int, bytes]:
    """Put ``body`` on an async service's input queue; -> (the result's status, its data)."""
    q = QueueClient(gw.endpoint, service)
    q.set_token(TOKEN)
    sink = QueueClient(gw.endpoint, f"{service}/sink")
    sink.set_token(TOKEN)
    q.init()
    sink.init()
    try:
        _index, rid = q.put(body)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            frames = sink.get(request_id=rid, length=1, timeout="2s")
            if frames:
                return int(frames[0].tags["status"]), bytes(frames[0].data)
        raise AssertionError(f"no result for {rid} in the sink of {service}")
    finally:
        q.close()
        sink.close()


@pytest.mark.parametrize("headers", [NO_AUTH, BAD_AUTH], ids=["no-token", "wrong-token"])
def test_unauthenticated_is_401_everywhere(gw: GatewayProcess, headers: dict[str, str]) -> None:
    for where, (status, hdrs, body) in _eas_calls(gw, "digits", b"\x00", headers).items():
        assert status == 401, where
        assert _eas_shape(body)["code"] == "Unauthorized", where
        assert hdrs.get("x-request-id") == json.loads(body)["request_id"], where
    for where, (status, _h, body) in _json_calls(gw, "digits", b"{}", headers).items():
        assert status == 401, where
        assert "token" in _error_shape(body), where
    # The queue front door of an asynchronous service.
    status, _h, body = raw_post(gw.port, "/api/predict/aecho", b"x", headers)
    assert status == 401 and _eas_shape(body)["code"] == "Unauthorized"


def test_unknown_service_is_404_everywhere(gw: GatewayProcess) -> None:
    for where, (status, _h, body) in _eas_calls(gw, "nope", b"x", AUTH).items():
        assert status == 404, where
        assert _eas_shape(body)["code"] == "ServiceNotFound", where
    # The worker's port serves its own service only: another name is not found there either.
    status, _h, body = raw_post(_worker_port(gw, "echo"), "/api/predict/nope", b"x", AUTH)
    assert status == 404 and _eas_shape(body)["code"] in ("ServiceNotFound", "NotFound")
    for where, (status, _h, body) in _json_calls(gw, "nope", b"{}", AUTH).items():
        assert status == 404, where
        assert "nope" in _error_shape(body) or "not found" in _error_shape(body), where


def test_malformed_body_is_the_same_400_everywhere(gw: GatewayProcess) -> None:
    garbage = b"\xff\x00 not a protobuf"
    calls = _eas_calls(gw, "digits", garbage, AUTH)
    bodies = {where: _eas_shape(body) for where, (_s, _h, body) in calls.items()}
    assert {s for s, _h, _b in calls.values()} == {400}
    assert len({(d["code"], d["message"]) for d in bodies.values()}) == 1, bodies
    status, data = _async_result(gw, "adigits", garbage)
    assert status == 400
    assert (json.loads(data)["code"], json.loads(data)["message"]) == (
        bodies["front"]["code"],
        bodies["front"]["message"],
    )
    for where, (status, _h, body) in _json_calls(gw, "digits", b"{not json", AUTH).items():
        assert status == 400, where
        _error_shape(body)


def test_failing_processor_is_the_same_everywhere(gw: GatewayProcess) -> None:
    calls = _eas_calls(gw, "echo", b"raise:on purpose", AUTH)
    statuses = {where: s for where, (s, _h, _b) in calls.items()}
    assert set(statuses.values()) == {400}, statuses
    messages = {where: _eas_shape(b)["message"] for where, (_s, _h, b) in calls.items()}
    assert all("on purpose" in m for m in messages.values()), messages
    status, data = _async_result(gw, "aecho", b"raise:on purpose")
    assert status == 400 and "on purpose" in json.loads(data)["message"]
    # A processor's own status passes through every entry point alike.
    for where, (status, _h, body) in _eas_calls(gw, "echo", b"status:502:upstream said no", AUTH).items():
        assert (status, body) == (502, b"upstream said no"), where
    assert _async_result(gw, "aecho", b"status:502:upstream said no") == (502, b"upstream said no")


def test_no_ready_worker_is_503_everywhere(gw: GatewayProcess) -> None:
    for where, (status, hdrs, body) in _eas_calls(gw, "broken", b"x", AUTH).items():
        assert status == 503, where
        assert _eas_shape(body)["code"] == "ServiceNotReady", where
        assert hdrs.get("retry-after") == "1", where
    v2 = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
    calls = _json_calls(gw, "broken", json.dumps(v2).encode(), AUTH)
    calls["v1"] = raw_post(
        gw.port, "/v1/models/broken:predict", json.dumps({"instances": [[0.0] * 64]}).encode(), AUTH
    )
    cs = {"instances": [{"input": [0.0] * 64}]}
    calls["cluster_serving"] = raw_post(
        gw.port, "/api/cluster-serving/broken/predict", json.dumps(cs).encode(), AUTH
    )
    for where, (status, _h, body) in calls.items():
        assert status == 503, (where, body)
        assert "ready" in _error_shape(body), where


def test_bearer_token_is_accepted_everywhere(gw: GatewayProcess) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for where, (status, _h, body) in _eas_calls(gw, "echo", b"hello", bearer).items():
        assert (status, body) == (200, b"hello"), where
    v2 = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
    calls = _json_calls(gw, "digits", json.dumps(v2).encode(), bearer)
    calls["v1"] = raw_post(gw.port, "/v1/models/digits:predict", b'{"instances": [[0.0]]}', bearer)
    del calls["cluster_serving"]
    assert calls["v2"][0] == calls["v2_binary"][0] == 200, calls
    # V1 with a malformed instance: past authentication, refused by the model's signature.
    assert calls["v1"][0] == 400, calls["v1"]


def test_grpc_answers_the_same_statuses(gw: GatewayProcess) -> None:
    """V2 gRPC: the same refusals, as the gRPC codes of the same statuses."""
    port = yaml.safe_load((gw.workdir / "services.yaml").read_text())["gateway"]["grpc_port"]
    zeros = np.zeros((1, 64), np.float32).tobytes()

    def infer(stub: pb_grpc.GRPCInferenceServiceStub, model: str, auth: str, raw: bytes = zeros) -> Any:
        req = pb.ModelInferRequest(model_name=model)
        req.inputs.add(name="input", datatype="FP32", shape=[1, 64])
        req.raw_input_contents.append(raw)
        return stub.ModelInfer(req, metadata=(("authorization", auth),) if auth else (), timeout=10)

    cases = [
        ("digits", "", zeros, grpc.StatusCode.UNAUTHENTICATED),
        ("digits", "not-the-token", zeros, grpc.StatusCode.UNAUTHENTICATED),
        ("nope", TOKEN, zeros, grpc.StatusCode.NOT_FOUND),
        ("digits", TOKEN, b"\xff\x00", grpc.StatusCode.INVALID_ARGUMENT),
        ("broken", TOKEN, zeros, grpc.StatusCode.UNAVAILABLE),
    ]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for model, auth, raw, code in cases:
            with pytest.raises(grpc.RpcError) as info:
                infer(stub, model, auth, raw)
            assert info.value.code() is code, (model, auth)  # type: ignore[attr-defined]
        assert len(infer(stub, "digits", f"Bearer {TOKEN}").outputs) == 2


def _paddle(
    gw: GatewayProcess, service: str, doc: Any, headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    """A Paddle Serving call; its error shape is checked: ``err_no`` is the HTTP status."""
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    status, _h, data = raw_post(
        gw.port, f"/{service}/prediction", body, {"Content-Type": "application/json", **headers}
    )
    answer = json.loads(data)
    if status != 200:
        assert {"err_no", "err_msg"} <= set(answer) and answer["err_no"] == status, answer
    return status, answer


def test_paddle_serving_answers_the_same_statuses(gw: GatewayProcess) -> None:
    feed = {"feed": [{"input": [0.0] * 64}], "fetch": ["label"]}
    for headers in (NO_AUTH, BAD_AUTH):
        status, answer = _paddle(gw, "digits", feed, headers)
        assert status == 401 and "token" in answer["err_msg"]
    assert _paddle(gw, "nope", feed, AUTH)[0] == 404
    assert _paddle(gw, "digits", b"{not json", AUTH)[0] == 400
    status, answer = _paddle(gw, "broken", feed, AUTH)
    assert status == 503 and "ready" in answer["err_msg"]
    status, answer = _paddle(gw, "digits", {"key": ["input"], "value": [",".join(["0"] * 63)]}, AUTH)
    assert status == 400 and answer["key"] == [] and "input 'input'" in answer["err_msg"]
    status, answer = _paddle(gw, "digits", feed, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and len(answer["result"]["label"]) == 1
