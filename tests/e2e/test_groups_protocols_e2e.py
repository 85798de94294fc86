"""Service groups over every protocol that calls a service by its name, through the real
gateway: EAS predict, KServe V1 and V2 REST, V2 gRPC (the protobuf stubs and Triton's own
clients). Each split is checkable without statistics: ``to-a`` sends every call to ``a`` (which
answers x + 1), ``to-b`` every call to ``b`` (x + 2). Every answer names the member that served
it; a group's metadata is its members' when they agree, else an error saying so; what a group
cannot be called as (a member with no V2 form, a version path, direct-mode discovery) is
refused in the protocol's own error shape, naming why."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import onnx
import pytest
from onnx import TensorProto, helper

from eas_sdk._core.constants import DISCOVERY_PATH_PREFIX
from gateway._proto import grpc_service_pb2 as pb
from gateway._proto import grpc_service_pb2_grpc as pb_grpc
from tests.e2e.gateway_proc import ECHO_ENTRY, GatewayProcess
from tests.e2e.test_kserve_clients_e2e import run_client
from tests.e2e.test_traffic_e2e import EAS_BODY, V1_BODY, V2_BODY, build_constant_model
from tests.waiting import wait_until

MEMBER = "X-Group-Member"


def build_renamed_model(path: Path) -> Path:
    """y = Identity(z): a signature no other member shares (its input is named ``z``)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["z"], ["y"])],
        "renamed",
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, grpc_port: int) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("gw-groups-protocols")
    common = {"processor": "onnx", "placement": "thread"}
    config = {
        "gateway": {"grpc_port": grpc_port, "shutdown_timeout_s": 5},
        "services": [
            {"name": "a", "model": str(build_constant_model(workdir / "a.onnx", 1.0)), **common},
            {"name": "b", "model": str(build_constant_model(workdir / "b.onnx", 2.0)), **common},
            {"name": "z", "model": str(build_renamed_model(workdir / "z.onnx")), **common},
            {"name": "code", "processor": "python", "entry": ECHO_ENTRY, "workers": 1},
            # A member with versions of its own: its split (all to version 1) applies after the group's.
            {
                "name": "v",
                "versions": {1: str(workdir / "a.onnx"), 2: str(workdir / "b.onnx")},
                "traffic": {1: 100, 2: 0},
                **common,
            },
        ],
        "groups": {
            "to-a": {"a": 100, "b": 0},
            "to-b": {"a": 0, "b": 100},
            "differ": {"a": 50, "z": 50},
            "with-code": {"a": 50, "code": 50},
            "to-v": {"v": 100},
        },
    }
    proc = GatewayProcess.start(config, workdir)
    try:
        for name in ("a", "b", "z", "code", "v"):
            proc.wait_workers_ready(name, 1)
        wait_until(lambda: proc.get_json("/v2/models/z/ready")[0] == 200, 30, "z's signature known")
        yield proc
    finally:
        proc.kill()


def _post(gw: GatewayProcess, path: str, body: bytes) -> tuple[int, str | None, Any]:
    """-> (status, the member header, the JSON answer)."""
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader(MEMBER), json.loads(resp.read())
    finally:
        conn.close()


def test_a_member_s_own_versions_apply_within_the_group(gw: GatewayProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        for asked, value in ((None, 1.0), ("2", 2.0)):
            headers = {"Content-Type": "application/json", **({"X-Model-Version": asked} if asked else {})}
            conn.request("POST", "/api/predict/to-v", body=EAS_BODY, headers=headers)
            resp = conn.getresponse()
            doc = json.loads(resp.read())
            got = (resp.status, resp.getheader(MEMBER), resp.getheader("X-Model-Version"))
            assert got == (200, "v", asked or "1") and doc["outputs"]["y"]["data"] == [value], (got, doc)
    finally:
        conn.close()


def _requests(gw: GatewayProcess, name: str) -> int:
    _, doc = gw.get_json("/api/status")
    return int(next(s for s in doc["services"] if s["name"] == name)["requests_total"])


def test_each_rest_protocol_calls_a_group_and_names_the_member(gw: GatewayProcess) -> None:
    before = _requests(gw, "b")
    status, member, doc = _post(gw, "/api/predict/to-a", EAS_BODY)
    assert (status, member, doc["outputs"]["y"]["data"]) == (200, "a", [1.0]), doc
    status, member, doc = _post(gw, "/v1/models/to-b:predict", V1_BODY)
    assert (status, member, doc) == (200, "b", {"predictions": [[2.0]]})
    status, member, doc = _post(gw, "/v2/models/to-b/infer", V2_BODY)
    assert (status, member, doc["outputs"][0]["data"]) == (200, "b", [2.0]), doc
    assert doc["model_name"] == "b"  # the model that ran the call, as the header says
    # The member's own metrics count the calls that landed on it.
    assert _requests(gw, "b") >= before + 2
    # A member called by its own name says so too.
    assert _post(gw, "/v2/models/a/infer", V2_BODY)[:2] == (200, "a")


@pytest.mark.parametrize(
    ("path", "body", "counted"),
    [
        ("/to-b/prediction", json.dumps({"feed": [{"x": [0.0]}], "fetch": ["y"]}).encode(), 1),  # Paddle
        # Cluster Serving's REST front keeps no request counts of its own, for any service.
        ("/api/cluster-serving/to-b/predict", json.dumps({"instances": [{"x": [0.0]}]}).encode(), 0),
    ],
)
def test_paddle_and_cluster_serving_call_a_group(
    gw: GatewayProcess, path: str, body: bytes, counted: int
) -> None:
    before = _requests(gw, "b")
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    assert (resp.status, resp.getheader(MEMBER)) == (200, "b"), data
    assert b"2.0" in data, data  # b's answer: 0 + 2
    assert _requests(gw, "b") == before + counted


def test_a_group_s_metadata_is_its_members_when_they_agree(gw: GatewayProcess) -> None:
    status, doc = gw.get_json("/v2/models/to-a")
    assert status == 200 and doc["name"] == "to-a" and [t["name"] for t in doc["inputs"]] == ["x"], doc
    assert gw.get_json("/v2/models/to-a/ready") == (200, {"name": "to-a", "ready": True})
    assert gw.get_json("/v1/models/to-a") == (200, {"name": "to-a", "ready": True})
    status, doc = gw.get_json("/v2/models/to-a/config")
    assert status == 200 and doc["name"] == "to-a", doc
    status, doc = gw.get_json("/v2/models/to-a/stats")
    assert status == 200 and {m["name"] for m in doc["model_stats"]} == {"a", "b"}, doc
    status, doc = gw.get_json("/v2/models/differ")
    assert status == 409 and "members (a, z) differ in their metadata" in doc["error"], doc


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        (
            "/v2/models/with-code/infer",
            V2_BODY,
            404,
            "service group 'with-code': model 'code' is not served over V2",
        ),
        (
            "/v1/models/with-code:predict",
            V1_BODY,
            404,
            "service group 'with-code': model 'code' is not served",
        ),
        (
            "/v2/models/to-a/versions/1/infer",
            V2_BODY,
            404,
            "'to-a' is a service group: it has no version '1'",
        ),
    ],
)
def test_a_group_a_protocol_cannot_serve_is_refused_in_its_shape(
    gw: GatewayProcess, path: str, body: bytes, status: int, message: str
) -> None:
    got, member, doc = _post(gw, path, body)
    assert (got, member) == (status, None) and message in doc["error"], doc


def test_a_group_s_other_members_still_serve_eas(gw: GatewayProcess) -> None:
    # Over EAS the python member is a service like any other: every call is answered.
    assert {_post(gw, "/api/predict/with-code", EAS_BODY)[:2] for _ in range(6)} <= {
        (200, "a"),
        (200, "code"),
    }


def test_direct_mode_discovery_and_remote_workers_of_a_group_are_refused(gw: GatewayProcess) -> None:
    status, doc = gw.get_json(DISCOVERY_PATH_PREFIX + "to-a")
    assert status == 400 and doc["code"] == "WrongServiceKind", doc
    message = doc["message"]
    assert "'to-a' is a service group, which has no workers of its own to call in direct mode" in message
    assert "name one of its members (a, b)" in message
    # Nor does a remote worker register under it.
    status, doc = gw.get_json("/api/v1/workers/to-a")
    assert (
        status == 400 and "'to-a' is a service group, which takes no workers of its own" in doc["message"]
    ), doc


def test_grpc_calls_a_group_and_names_the_member(gw: GatewayProcess, grpc_port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for group, member, value in (("to-a", "a", 1.0), ("to-b", "b", 2.0)):
            req = pb.ModelInferRequest(model_name=group)
            req.inputs.add(name="x", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(0.0)
            answer, call = stub.ModelInfer.with_call(req, timeout=10)
            assert dict(call.trailing_metadata() or ())["x-group-member"] == member
            assert answer.model_name == member and list(answer.outputs[0].contents.fp32_contents) == [value]
        # A stream's answers name the member each request ran on.
        stream = []
        for group in ("to-a", "to-b"):
            req = pb.ModelInferRequest(model_name=group)
            req.inputs.add(name="x", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(0.0)
            stream.append(req)
        answers = list(stub.ModelStreamInfer(iter(stream), timeout=10))
        assert [(a.error_message, a.infer_response.model_name) for a in answers] == [("", "a"), ("", "b")]
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="to-b"), timeout=10)
        assert meta.name == "to-b" and [t.name for t in meta.inputs] == ["x"]
        assert stub.ModelReady(pb.ModelReadyRequest(name="to-b"), timeout=10).ready
        config = stub.ModelConfig(pb.ModelConfigRequest(name="to-b"), timeout=10)
        assert config.config.name == "to-b"
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelConfig(pb.ModelConfigRequest(name="differ"), timeout=10)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "differ in their configuration" in str(info.value.details())


def test_triton_clients_call_groups_by_name(gw: GatewayProcess, grpc_port: int, tmp_path: Path) -> None:
    out = tmp_path / "groups.json"
    run_client(
        ".venv-clients", "triton_groups.py", f"127.0.0.1:{gw.port}", f"127.0.0.1:{grpc_port}", str(out)
    )
    results = json.loads(out.read_text())
    for client in ("http", "grpc"):
        got = results[client]
        assert (got["to-a"], got["to-b"]) == (1.0, 2.0), (client, got)
        assert got["metadata"] == {"name": "to-a", "inputs": ["x"]} and got["ready"] is True, (client, got)
        assert "members (a, z) differ in their metadata" in got["disagree"][1], (client, got)
        assert "model 'code' is not served over V2" in got["no_v2"][1], (client, got)
        assert "it has no version '1' of its own" in got["version"][1], (client, got)
    assert results["grpc"]["disagree"][0] == "StatusCode.FAILED_PRECONDITION"
    assert results["grpc"]["no_v2"][0] == "StatusCode.NOT_FOUND"
    assert results["http"]["disagree"][0] == "409"
