"""Traffic between a service's model versions, through the real gateway: a 90/10 split lands
within a binomial bound that cannot flake, a call pins its version by header (EAS, V1) or
path (V2, gRPC) and every answer names the version that served it, the split changes at
run time (admin API, CLI) with no failed call, and each bad split is refused precisely with
the running one unchanged.

Each version is a tiny ONNX model built here that answers ``x + version``, so an answer
shows which version served it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import socket
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import onnx
import pytest
from onnx import TensorProto, helper

from gateway._proto import grpc_service_pb2 as pb
from gateway._proto import grpc_service_pb2_grpc as pb_grpc
from tests.e2e.gateway_proc import GatewayProcess, in_threads
from tests.e2e.test_services_e2e import ADMIN_TOKEN, admin_url, cli
from tests.e2e.test_services_e2e import http as json_call
from tests.waiting import wait_until

CALLS = 4000
# The chance that a fair split lands outside the bound the test allows.
FALSE_ALARM = 1e-9


def build_constant_model(path: Path, value: float) -> Path:
    """y = x + value: a float input [n, 1] and its output, opset 13."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        "constant",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])],
        initializer=[helper.make_tensor("c", TensorProto.FLOAT, [1], [value])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def binomial_bounds(n: int, p: float, alarm: float) -> tuple[int, int]:
    """The smallest and largest counts of n draws with chance p that a fair draw leaves only
    ``alarm`` (both tails together) of falling outside."""

    def pmf(k: int) -> float:
        log = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        return math.exp(log + k * math.log(p) + (n - k) * math.log1p(-p))

    lo, tail = 0, 0.0
    while tail + pmf(lo) <= alarm / 2:
        tail += pmf(lo)
        lo += 1
    hi, tail = n, 0.0
    while tail + pmf(hi) <= alarm / 2:
        tail += pmf(hi)
        hi -= 1
    return lo, hi


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("gw-traffic")
    v1 = build_constant_model(workdir / "v1.onnx", 1.0)
    v2 = build_constant_model(workdir / "v2.onnx", 2.0)
    config = {
        "admin": {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN},
        "gateway": {"grpc_port": _free_port(), "shutdown_timeout_s": 5},
        "services": [
            {
                "name": "m", "processor": "onnx", "placement": "thread", "public": True,
                "versions": {1: str(v1), 2: str(v2)}, "traffic": {1: 90, 2: 10},
            },
            {"name": "single", "processor": "onnx", "placement": "thread", "public": True, "model": str(v1)},
            # Asynchronous: its dispatcher's calls are split too (all to the older version here).
            {
                "name": "am", "processor": "onnx", "placement": "thread", "public": True, "async": True,
                "versions": {1: str(v1), 2: str(v2)}, "traffic": {1: 100, 2: 0},
            },
            # A pipeline's step calls "pm" through the dataplane: its calls are split too.
            {
                "name": "pm", "processor": "onnx", "placement": "thread", "public": True,
                "versions": {1: str(v1), 2: str(v2)}, "traffic": {1: 100, 2: 0},
            },
            {
                "name": "p", "processor": "pipeline", "public": True,
                "pipeline": {
                    "inputs": {"x": {"dtype": "float32", "shape": [-1, 1]}},
                    "steps": [
                        {"name": "s", "service": "pm", "inputs": {"x": "request.x"},
                         "outputs": {"y": "float32"}},
                    ],
                    "outputs": {"y": "s.y"},
                },
            },
            # Changed only by reloads of the file (a split set through the API stays on top of it).
            {
                "name": "r", "processor": "onnx", "placement": "thread", "public": True,
                "versions": {1: str(v1), 2: str(v2)}, "traffic": {1: 100, 2: 0},
            },
        ],
    }  # fmt: skip
    proc = GatewayProcess.start(config, workdir)
    try:
        for name in ("m", "single", "r"):
            proc.wait_workers_ready(name, 1)
        for name in ("m", "r"):
            wait_until(
                lambda name=name: proc.get_json(f"/v2/models/{name}/versions/1/ready")[0] == 200,
                30,
                "version 1 ready",
            )
        yield proc
    finally:
        proc.kill()


EAS_BODY = json.dumps({"inputs": {"x": [[0.0]]}}).encode()
V1_BODY = json.dumps({"instances": [[0.0]]}).encode()
V2_BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]}).encode()


def _call(
    conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, str | None, Any]:
    """(status, X-Model-Version answered, the version the answer's value shows or the error)."""
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    if resp.status != 200:
        return resp.status, resp.getheader("X-Model-Version"), data
    if "outputs" in data and isinstance(data["outputs"], dict):  # EAS JSON form
        value = data["outputs"]["y"]["data"][0]
    elif "predictions" in data:  # V1
        value = (
            data["predictions"][0][0] if isinstance(data["predictions"][0], list) else data["predictions"][0]
        )
    else:  # V2
        value = data["outputs"][0]["data"][0]
        assert data["model_version"] == str(int(value))  # the body names the version too
    return resp.status, resp.getheader("X-Model-Version"), str(int(value))


def _calls(
    gw: GatewayProcess, path: str, body: bytes, n: int, headers: dict[str, str] | None = None
) -> Counter:
    """n calls over four connections -> Counter of (status, header version, served version)."""
    seen: Counter = Counter()
    lock = threading.Lock()

    def run(count: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
        try:
            for _ in range(count):
                status, header, served = _call(conn, path, body, headers)
                with lock:
                    seen[(status, header, served if status == 200 else json.dumps(served))] += 1
        finally:
            conn.close()

    in_threads(n, run)
    return seen


@contextlib.contextmanager
def _steady_load(gw: GatewayProcess, path: str) -> Iterator[Counter]:
    """EAS calls to ``path``, one after another on one connection, for as long as the block
    runs: the statuses they got."""
    results: Counter = Counter()
    stop = threading.Event()

    def load() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
        try:
            while not stop.is_set():
                results[_call(conn, path, EAS_BODY)[0]] += 1
        finally:
            conn.close()

    loader = threading.Thread(target=load)
    loader.start()
    try:
        yield results
    finally:
        stop.set()
        loader.join()


def _admin(gw: GatewayProcess, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
    body = None if doc is None else json.dumps(doc).encode()
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    return json_call(admin_url(gw) + path, body, headers, method)


def test_a_90_10_split_lands_within_its_binomial_bound(gw: GatewayProcess) -> None:
    seen = _calls(gw, "/api/predict/m", EAS_BODY, CALLS)
    assert set(seen) <= {(200, "1", "1"), (200, "2", "2")}, seen  # the header names the one that served
    lo, hi = binomial_bounds(CALLS, 0.1, FALSE_ALARM)
    assert hi - lo < CALLS * 0.06  # within 3 points either way: the test tells 90/10 from 85/15
    assert lo <= seen[(200, "2", "2")] <= hi, (seen, lo, hi)


def test_a_call_pins_its_version_and_the_answer_names_it(gw: GatewayProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        for version in ("1", "2"):
            pin = {"X-Model-Version": version}
            for path, body in (("/api/predict/m", EAS_BODY), ("/v1/models/m:predict", V1_BODY)):
                assert {_call(conn, path, body, pin) for _ in range(20)} == {(200, version, version)}, path
            # V2 pins by its path; the answer's model_version and header say the same.
            path = f"/v2/models/m/versions/{version}/infer"
            assert {_call(conn, path, V2_BODY) for _ in range(20)} == {(200, version, version)}
            assert {_call(conn, "/v2/models/m/infer", V2_BODY, pin) for _ in range(20)} == {
                (200, version, version)
            }
        # A version the service does not serve: 404 naming the header and the versions it has.
        status, _, err = _call(conn, "/api/predict/m", EAS_BODY, {"X-Model-Version": "7"})
        assert status == 404 and "no version '7' (X-Model-Version); it serves 1, 2" in json.dumps(err), err
        # A service without versions serves its one model whatever the header says, and says nothing.
        status, header, _ = _call(conn, "/api/predict/single", EAS_BODY, {"X-Model-Version": "7"})
        assert (status, header) == (200, None)
    finally:
        conn.close()


def test_grpc_answers_name_the_version(gw: GatewayProcess) -> None:
    import yaml

    port = yaml.safe_load((gw.workdir / "services.yaml").read_text())["gateway"]["grpc_port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for version in ("1", "2", *[""] * 20):
            req = pb.ModelInferRequest(model_name="m", model_version=version)
            req.inputs.add(name="x", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(0.0)
            answer, call = stub.ModelInfer.with_call(req, timeout=10)
            # The trailing metadata and the answer name the version that served the call.
            assert answer.model_version == dict(call.trailing_metadata() or ())["x-model-version"]
            assert answer.model_version == (version or answer.model_version) and answer.model_version in (
                "1",
                "2",
            )


def test_the_split_changes_at_run_time_without_a_failed_call(gw: GatewayProcess) -> None:
    try:
        with _steady_load(gw, "/api/predict/m") as results:
            status, doc = _admin(gw, "PUT", "/admin/services/m/traffic", {"traffic": {"1": 0, "2": 100}})
            assert status == 200 and doc["spec"]["traffic"] == {"1": 0, "2": 100}, doc
            assert _calls(gw, "/api/predict/m", EAS_BODY, 40) == Counter({(200, "2", "2"): 40})
            out = cli(gw, "services", "traffic", "m", "1=100", "2=0")
            assert (
                out.returncode == 0
                and out.stdout.strip() == "service m traffic: version 1: 100%, version 2: 0%"
            )
            assert _calls(gw, "/api/predict/m", EAS_BODY, 40) == Counter({(200, "1", "1"): 40})
    finally:
        _admin(gw, "PUT", "/admin/services/m/traffic", {"1": 90, "2": 10})
    assert set(results) == {200} and results[200] > 0, results


@pytest.mark.parametrize(
    ("name", "doc", "message"),
    [
        ("m", {"1": 50, "2": 40}, "traffic: the percents add up to 90, not 100"),
        ("m", {"1": 50, "3": 50}, "traffic: version '3' is not one the service serves (1, 2)"),
        ("m", {"1": 101, "2": -1}, "traffic.1: expected a whole percent from 0 to 100, got 101"),
        ("m", {"1": "ninety", "2": 10}, "traffic.1: expected a whole percent from 0 to 100, got 'ninety'"),
        ("m", [90, 10], 'expected {"traffic": {"<version>": <percent>, ...}}'),
        ("single", {"1": 100}, "traffic: the service serves one version; list its versions"),
    ],
)
def test_a_bad_split_is_refused_and_the_running_one_stays(
    gw: GatewayProcess, name: str, doc: Any, message: str
) -> None:
    status, err = _admin(gw, "PUT", f"/admin/services/{name}/traffic", doc)
    assert status == 400 and err["code"] == "BadRequest" and message in err["message"], err
    status, described = _admin(gw, "GET", "/admin/services/m")
    assert described["spec"]["traffic"] == {"1": 90, "2": 10}
    status, _ = _admin(gw, "PUT", "/admin/services/nope/traffic", {"1": 100})
    assert status == 404


def test_the_cli_refuses_a_malformed_weight(gw: GatewayProcess) -> None:
    out = cli(gw, "services", "traffic", "m", "1:90")
    assert out.returncode == 1 and "traffic: expected VERSION=PERCENT (e.g. 1=90), got '1:90'" in out.stderr


def test_status_page_metrics_and_access_lines_carry_the_version(gw: GatewayProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        rid = "traffic-access-line-check"
        headers = {"X-Model-Version": "1", "X-Request-Id": rid}
        assert _call(conn, "/api/predict/m", EAS_BODY, headers)[:2] == (200, "1")
        status, _, _ = _call(
            conn, "/v1/models/m:predict", V1_BODY, {"X-Model-Version": "2", "X-Request-Id": rid + "-2"}
        )
        assert status == 200
    finally:
        conn.close()
    status, doc = gw.get_json("/api/status")
    entry = next(s for s in doc["services"] if s["name"] == "m")
    assert set(entry["versions"]) == {"1", "2"}
    assert entry["versions"]["1"]["traffic_percent"] == 90 and entry["versions"]["2"]["traffic_percent"] == 10
    assert entry["versions"]["1"]["requests_total"] >= 1 and entry["versions"]["2"]["requests_total"] >= 1
    assert "versions" not in next(s for s in doc["services"] if s["name"] == "single")
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    assert 'easgw_version_requests_total{service="m",status="200",version="1"}' in metrics
    wait_until(lambda: f"rid={rid} version=1" in gw.output(), 10, "the access line naming version 1")
    wait_until(lambda: f"rid={rid}-2 version=2" in gw.output(), 10, "the access line naming version 2")


def test_a_reload_changes_the_split_without_a_failed_call(gw: GatewayProcess) -> None:
    import yaml

    assert _calls(gw, "/api/predict/r", EAS_BODY, 20) == Counter({(200, "1", "1"): 20})
    path = gw.workdir / "services.yaml"
    config = yaml.safe_load(path.read_text())
    for svc in config["services"]:
        if svc["name"] == "r":
            svc["traffic"] = {1: 0, 2: 100}
    path.write_text(yaml.safe_dump(config))
    with _steady_load(gw, "/api/predict/r") as results:
        status, done = _admin(gw, "POST", "/admin/reload")
        assert status == 200 and done["changed"] == ["r"], done
        assert _calls(gw, "/api/predict/r", EAS_BODY, 20) == Counter({(200, "2", "2"): 20})
        # Every older version serves on after the reload, this service's and the others'.
        for path in ("/api/predict/r", "/api/predict/m"):
            assert _calls(gw, path, EAS_BODY, 4, {"X-Model-Version": "1"}) == Counter({(200, "1", "1"): 4})
    assert set(results) == {200}, results


def test_an_asynchronous_service_s_records_follow_the_split(gw: GatewayProcess) -> None:
    from tests.e2e.async_common import SinkCollector

    sink = SinkCollector(gw.endpoint, "am")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
        try:
            for _ in range(5):
                conn.request(
                    "POST", "/api/predict/am", body=EAS_BODY, headers={"Content-Type": "application/json"}
                )
                resp = conn.getresponse()
                resp.read()
                assert resp.status == 200
        finally:
            conn.close()
        frames = sink.wait(5, 60)
    finally:
        sink.stop()
    assert len(frames) == 5, frames
    # Every record was served by version 1, which the split gives every call.
    assert {json.loads(body)["outputs"]["y"]["data"][0] for _, _, body in frames} == {1.0}, frames


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/m/prediction", json.dumps({"feed": [{"x": [0.0]}], "fetch": ["y"]}).encode()),  # Paddle
        ("/api/cluster-serving/m/predict", json.dumps({"instances": [{"x": [0.0]}]}).encode()),
    ],
)
def test_paddle_and_cluster_serving_pin_and_name_the_version(
    gw: GatewayProcess, path: str, body: bytes
) -> None:
    for version in ("1", "2"):
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
        try:
            conn.request(
                "POST",
                path,
                body=body,
                headers={"Content-Type": "application/json", "X-Model-Version": version},
            )
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        assert (resp.status, resp.getheader("X-Model-Version")) == (200, version), data
        assert f"{float(version)}".encode() in data, data  # the model's answer: 0 + version


def test_a_pipeline_step_s_calls_follow_the_split(gw: GatewayProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        # Version 1 takes every call that names none; the latest (2) would answer 2.
        assert {_call(conn, "/v2/models/p/infer", V2_BODY)[2] for _ in range(10)} == {"1"}
    finally:
        conn.close()


def _version_calls(gw: GatewayProcess, service: str, version: str) -> float:
    """easgw_version_requests_total of a service's version, status 200 (0 before its first)."""
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    series = f'easgw_version_requests_total{{service="{service}",status="200",version="{version}"}} '
    return next((float(line[len(series) :]) for line in metrics.splitlines() if line.startswith(series)), 0.0)


def test_grpc_calls_are_counted_and_logged_per_version(gw: GatewayProcess) -> None:
    import yaml

    port = yaml.safe_load((gw.workdir / "services.yaml").read_text())["gateway"]["grpc_port"]
    infer = "GRPC /inference.GRPCInferenceService/ModelInfer 200"

    def lines() -> list[str]:
        return [line for line in gw.output().splitlines() if infer in line]

    def naming_2() -> int:
        return sum(line.endswith(" version=2") for line in lines())

    def listed() -> int:
        _, doc = gw.get_json("/api/status")
        return int(next(s for s in doc["services"] if s["name"] == "m")["versions"]["2"]["requests_total"])

    logged, counted, shown = naming_2(), _version_calls(gw, "m", "2"), listed()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        req = pb.ModelInferRequest(model_name="m", model_version="2")
        req.inputs.add(name="x", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(0.0)
        for _ in range(3):
            assert stub.ModelInfer(req, timeout=10).model_version == "2"
        one = pb.ModelInferRequest(model_name="single")
        one.inputs.add(name="x", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(0.0)
        stub.ModelInfer(one, timeout=10)
    assert _version_calls(gw, "m", "2") == counted + 3
    assert listed() >= shown + 3
    # The access lines name the version that served each call, as an HTTP call's do; a
    # service without versions names none.
    wait_until(lambda: naming_2() >= logged + 3, 10, "3 more access lines naming version 2")
    assert any("version=" not in line for line in lines()), lines()
