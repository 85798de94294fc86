"""Attacks on the real gateway that cost memory or event-loop time, each measured.

While each attack runs, another service is called in a loop (its p99 latency) and the
gateway's RSS is sampled; the attacker must get the documented 4xx, the gateway's RSS may
grow by at most ``RSS_BOUND_MB`` over its level before the attack and the other service's
p99 stays at most ``P99_BOUND_S``, or five times its slowest call with no attack where this
machine is slower than that (calibration, as in docs/reliability.md, instead of one fixed
figure: over the few dozen calls of an attack, the p99 is about the slowest call). The
slowest call with no attack is measured just before the attack and, when the p99 is past
the bound, again just after: a shared machine whose load rose during the attack is not an
attack that held the other service up.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pytest
import yaml

from eas_sdk import QueueClient
from gateway._proto import grpc_service_pb2 as pb
from gateway._proto import grpc_service_pb2_grpc as pb_grpc
from tests.e2e.gateway_proc import ECHO_ENTRY, ROOT, GatewayProcess, raw_post
from tests.waiting import wait_until

TOKEN = "e2e-hostile-token-5f1c0a9e"
RSS_BOUND_MB = 256
P99_BOUND_S = 0.100
BASELINE_FACTOR = 5  # the p99 gate's multiple of the slowest call with no attack
MAX_UNVERIFIED = 8 << 20


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> Iterator[GatewayProcess]:
    config = {
        "gateway": {
            "max_connections": 96,
            "max_unverified_bytes": MAX_UNVERIFIED,
            "max_inflight_per_service": 2,
            "max_response_bytes": 1 << 20,
        },
        "services": [
            {"name": "digits", "processor": "onnx", "model": str(digits_model), "token": TOKEN},
            {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, "workers": 2},
            {"name": "aecho", "processor": "python", "entry": ECHO_ENTRY, "async": True, "token": TOKEN},
        ],
    }
    proc = GatewayProcess.start(config, tmp_path_factory.mktemp("gw-hostile"))
    try:
        proc.wait_workers_ready("digits", 1)
        proc.wait_workers_ready("echo", 2)
        proc.wait_workers_ready("aecho", 1)
        yield proc
    finally:
        proc.kill()


def _model_workers(gw: GatewayProcess) -> set[int]:
    return {w["pid"] for svc in gw.services().values() for w in svc.get("workers", []) if w.get("pid")}


def _p99(latencies: list[float]) -> float:
    lat = sorted(latencies)
    return lat[min(len(lat) - 1, int(len(lat) * 0.99))]


def _baseline(gw: GatewayProcess, calls: int = 100) -> float:
    """The probe's slowest call with no attack, just before one (about a second of calls at
    the probe's pace): what this machine gives now, loaded or not."""
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    latencies = []
    try:
        for _ in range(calls):
            t0 = time.perf_counter()
            conn.request("POST", "/api/predict/echo", body=b"ping")
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, b"ping")
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.01)  # the probe's pace
    finally:
        conn.close()
    return max(latencies)


class Probe:
    """Calls echo in a loop on one kept-alive connection and samples the gateway's RSS.
    ``helpers``: with the processes the gateway starts to do its own work (its parser
    process), every child but the model workers. ``check_latency``: first measure the
    slowest call with no attack, for the p99 gate."""

    def __init__(self, gw: GatewayProcess, helpers: bool = False, check_latency: bool = True) -> None:
        self.gw = gw
        self.proc = psutil.Process(gw.pid)
        self.workers = _model_workers(gw) if helpers else None
        self.latencies: list[float] = []
        self.calls: list[tuple[float, float]] = []  # each call's (sent, answered) perf_counter
        self.baseline = _baseline(gw) if check_latency else 0.0
        self.rss_peak = self.base_rss = self.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        total = self.proc.memory_info().rss
        if self.workers is not None:
            for child in self.proc.children(recursive=True):
                if child.pid not in self.workers:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        total += child.memory_info().rss
        return total

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.gw.port, timeout=10)
        while not self._stop.is_set():
            t0 = time.perf_counter()
            conn.request("POST", "/api/predict/echo", body=b"ping")
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, b"ping")
            t1 = time.perf_counter()
            self.latencies.append(t1 - t0)
            self.calls.append((t0, t1))
            self.rss_peak = max(self.rss_peak, self.rss())
            self._stop.wait(0.01)  # a sample about every 10 ms
        conn.close()

    def __enter__(self) -> Probe:
        self._thread.start()
        wait_until(lambda: self.latencies, 10, "the probe's first call to the other service")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def check(self, p99_bound_s: float | None = P99_BOUND_S) -> None:
        grown_mb = (self.rss_peak - self.base_rss) / (1 << 20)
        lat = self.latencies
        assert len(lat) >= 10, "the other service was not answered during the attack"
        p99 = _p99(lat)
        print(
            f"RSS growth {grown_mb:.1f} MB, echo p99 {p99 * 1000:.1f} ms over {len(lat)} calls"
            f" (slowest with no attack {self.baseline * 1000:.1f} ms)"
        )
        assert grown_mb <= RSS_BOUND_MB, f"gateway RSS grew {grown_mb:.0f} MB"
        if p99_bound_s is not None:
            bound = max(p99_bound_s, BASELINE_FACTOR * self.baseline)
            if p99 > bound:
                # The machine's load may have changed since the baseline (a shared runner, a
                # busy second core): what it gives right after the attack counts too, so the
                # gate compares the attack with the machine as it was around it.
                after = _baseline(self.gw)
                print(f"slowest with no attack, just after: {after * 1000:.1f} ms")
                bound = max(bound, BASELINE_FACTOR * after)
            assert p99 <= bound, (
                f"echo p99 {p99 * 1000:.1f} ms over {len(lat)} calls, bound {bound * 1000:.1f} ms"
            )


def _status(sock: socket.socket, timeout: float = 5.0) -> tuple[int, bytes]:
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(
            next(
                (ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")),
                b"0",
            )
        )
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return int(head.split()[1]), rest
    return 0, data


def _post(
    gw: GatewayProcess, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, data
    finally:
        conn.close()


def _attack(n: int, action: Callable[[int], Any]) -> list[Any]:
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        out[i] = action(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_unauthenticated_bodies_are_capped(gw: GatewayProcess) -> None:
    """EAS-signed (so unverifiable before their body) 4 MB uploads that never finish: only
    MAX_UNVERIFIED worth are received at once, the others get 429 before their body is read."""
    length = 4 << 20
    socks: list[socket.socket] = []

    def start(i: int) -> tuple[int, bytes]:
        path = "/api/predict/digits" if i % 2 else "/api/cluster-serving/digits/predict"
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: EAS {'A' * 27}=\r\n"
            f"Content-Length: {length}\r\n\r\n"
        ).encode()
        sock = socket.create_connection(("127.0.0.1", gw.port))
        socks.append(sock)
        sock.sendall(head + b"x" * (1 << 20))
        return _status(sock, timeout=1.5)

    try:
        with Probe(gw) as probe:
            results = _attack(40, start)
        refused = [body for status, body in results if status == 429]
        # At most MAX_UNVERIFIED / length bodies are admitted; they wait for the rest of their body.
        assert len(refused) >= 40 - MAX_UNVERIFIED // length, results[:3]
        assert all(b"TooManyRequests" in b or b"error" in b for b in refused)
        probe.check()
    finally:
        for s in socks:
            s.close()
    assert 'easgw_admission_refused_total{reason="unverified_bytes"}' in _metrics(gw)


def _connections(gw: GatewayProcess) -> float:
    """The gateway's count of open client connections (its /metrics; this call's included),
    or infinity while it refuses this call too (no figures in its answer)."""
    line = next((ln for ln in _metrics(gw).splitlines() if ln.startswith("easgw_connections ")), None)
    return float(line.split()[1]) if line else float("inf")


def _metrics(gw: GatewayProcess) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def _png_b64(width: int, height: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_cluster_serving_type_and_image_bombs(gw: GatewayProcess) -> None:
    path = "/api/cluster-serving/digits/predict"
    auth = {"Authorization": TOKEN}
    bomb = json.dumps({"instances": [{"input": _png_b64(9000, 9000)}]}).encode()
    dtype_bomb = json.dumps(
        {"instances": [{"input": {"shape": [64], "dtype": "U100000000", "data": ["a"] * 64}}]}
    ).encode()

    def hit(i: int) -> tuple[int, Any]:
        return _post(gw, path, bomb if i % 2 else dtype_bomb, auth)

    with Probe(gw) as probe:
        results = [r for _ in range(3) for r in _attack(6, hit)]  # long enough to sample
    for i, (status, doc) in enumerate(results):
        assert (status, set(doc)) == ((413, {"error"}) if i % 2 else (400, {"error"})), doc
    probe.check()
    # An allowed explicit dtype works.
    row = {"shape": [64], "dtype": "float32", "data": [0.5] * 64}
    status, doc = _post(gw, path, json.dumps({"instances": [{"input": row}]}).encode(), auth)
    assert status == 200 and len(doc["predictions"]) == 1, doc


def test_value_dense_json_is_parsed_one_at_a_time(gw: GatewayProcess) -> None:
    """JSON whose values are tiny (each a Python object of ~80 bytes once parsed): concurrent
    such bodies are parsed one after another, in the parser process (so another service's
    calls are answered while they are parsed), a body over max_json_values is refused
    unparsed, and one the model's signature refuses (strings for its float input) is refused
    there, with the model's own message: its workers never see it."""
    path = "/api/cluster-serving/digits/predict"
    dense = b'{"instances": [{"input": [' + b'"ab",' * 950_000 + b'"ab"]}]}'
    over = b'{"instances": [{"input": [' + b'"ab",' * 1_000_000 + b'"ab"]}]}'
    answered: list[float] = []

    def hit(i: int) -> tuple[int, Any]:
        out = _post(gw, path, over if i == 0 else dense, {"Authorization": TOKEN})
        answered.append(time.perf_counter())
        return out

    failed_before = _worker_failures(gw)
    with Probe(gw, check_latency=False) as probe:
        sent = time.perf_counter()
        results = _attack(4, hit)
    assert results[0][0] == 413 and "JSON values" in results[0][1]["error"], results[0]
    # The test gateway allows 2 calls in flight (429); the others are refused by the parser.
    refused = [doc for status, doc in results[1:] if status == 400]
    assert refused and len(refused) + sum(s == 429 for s, _ in results[1:]) == 3, results
    assert all(
        doc == {"error": "input 'input': expected float32[N,64], got string[1,950001]"} for doc in refused
    )
    assert _worker_failures(gw) == failed_before  # no call reached a worker
    # While the bodies were parsed, the other service was answered: an echo call went out
    # after the attack began and came back before its last answer (an order, not a latency).
    assert any(sent <= t0 and t1 <= max(answered) for t0, t1 in probe.calls), "echo waited for the attack"
    probe.check(p99_bound_s=None)


def _worker_failures(gw: GatewayProcess) -> int:
    """The calls of digits its workers answered with an error (Triton's statistics)."""
    status, doc = gw.call_json("/v2/models/digits/stats", headers={"Authorization": TOKEN})
    assert status == 200, doc
    return int(doc["model_stats"][0]["inference_stats"]["fail"]["count"])


def test_calls_in_flight_per_service(gw: GatewayProcess) -> None:
    results = _attack(4, lambda i: _post(gw, "/api/predict/echo", b"sleep:0.5"))
    statuses = sorted(status for status, _ in results)
    assert statuses == [200, 200, 429, 429], results
    assert all(doc["code"] == "TooManyRequests" for status, doc in results if status == 429)


def test_answer_size_is_bounded(gw: GatewayProcess) -> None:
    status, doc = _post(gw, "/api/predict/echo", b"x" * (2 << 20))
    assert (status, doc["code"]) == (413, "ResponseTooLarge")
    assert _post(gw, "/api/predict/echo", b'"small"') == (200, "small")
    # An asynchronous call: the refusal is its result, at once (retrying cannot help).
    q, sink = QueueClient(gw.endpoint, "aecho"), QueueClient(gw.endpoint, "aecho/sink")
    for client in (q, sink):
        client.set_token(TOKEN)
        client.init()
    try:
        started = time.monotonic()
        _index, rid = q.put(b"x" * (2 << 20))
        frames: list[Any] = []
        while not frames and time.monotonic() - started < 10:
            frames = sink.get(request_id=rid, length=1, timeout="2s")
        assert frames and frames[0].tags["status"] == "413", frames
        assert gw.services()["aecho"]["dispatcher"]["retries_total"] == 0  # the first answer stands
    finally:
        q.close()
        sink.close()


def test_connections_are_capped(gw: GatewayProcess) -> None:
    socks = []
    try:
        for _ in range(120):
            socks.append(socket.create_connection(("127.0.0.1", gw.port)))
        for s in socks:
            s.setblocking(False)
        refused: set[int] = set()

        def all_over_the_cap_refused() -> bool:
            for i, s in enumerate(socks):
                with contextlib.suppress(BlockingIOError):
                    if i not in refused and s.recv(4096).startswith(b"HTTP/1.1 503"):
                        refused.add(i)
            return len(refused) >= 120 - 96

        wait_until(all_over_the_cap_refused, 10, "a 503 on every connection over the cap")
    finally:
        for s in socks:
            s.close()
    # Once the gateway has seen them close, it takes calls again.
    wait_until(lambda: _connections(gw) < 96, 10, "the closed connections let go")
    assert _post(gw, "/api/predict/echo", b'"ok"') == (200, "ok")
    assert 'easgw_admission_refused_total{reason="connections"}' in _metrics(gw)


def test_a_body_over_the_size_limit_is_413_not_429_on_every_route(gw: GatewayProcess) -> None:
    """A declared length past every budget is still a body too large (413), whatever the route."""
    for path in ("/api/predict/digits", "/v2/models/digits/infer", "/api/cluster-serving/digits/predict"):
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {300 << 20}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", gw.port)) as sock:
            sock.sendall(head + b"{" * 1024)
            status, _body = _status(sock, timeout=5.0)
        assert status == 413, path


# --- answers whose size follows the client's shape ------------------------------------------
#
# A gateway with the default response limit (64 MiB): a Cluster Serving model whose sparse
# input becomes a dense output of the shape the client declares, and a model that answers a
# tensor of the dimensions it is given, every value FILL: 4 bytes of the model's answer, 11
# to 20 bytes of JSON text (0.12345679 or 0.12345679104328156, as each protocol writes it).

FILL = 0.123456789
FILL_TEXT = b"0.12345679"
LIMIT = 64 << 20
# The fill worker's growth for a 36 MB output refused as JSON: the output and ONNX Runtime's
# arena for it, not the 180 MB of text an encoding before the check would hold.
WORKER_BOUND_MB = 120


def _fill_model(path: Path) -> Path:
    """``dims`` int64 [1, 2] -> ``fill`` float32 [1, dims[0], dims[1]], every value FILL."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["dims", "flat_shape"], ["flat"]),
            helper.make_node("Concat", ["one", "flat"], ["full"], axis=0),
            helper.make_node(
                "ConstantOfShape",
                ["full"],
                ["fill"],
                value=helper.make_tensor("v", TensorProto.FLOAT, [1], [FILL]),
            ),
        ],
        "fill",
        [helper.make_tensor_value_info("dims", TensorProto.INT64, ["N", 2])],
        [helper.make_tensor_value_info("fill", TensorProto.FLOAT, [1, "H", "W"])],
        [
            helper.make_tensor("flat_shape", TensorProto.INT64, [1], [-1]),
            helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def answers_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("gw-answers")
    sys.path.insert(0, str(ROOT / "samples"))
    from build_cluster_serving_model import build

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        grpc_port = sock.getsockname()[1]
    config = {
        "gateway": {"max_response_bytes": LIMIT, "grpc_port": grpc_port},
        "services": [
            {"name": "cs", "processor": "onnx", "model": str(build(work / "models")), "token": TOKEN},
            {
                "name": "fill",
                "processor": "onnx",
                "placement": "process",
                "model": str(_fill_model(work / "fill.onnx")),
                "token": TOKEN,
            },
            {
                "name": "fill3",
                "processor": "pipeline",
                "token": TOKEN,
                "pipeline": {
                    "inputs": {"dims": {"dtype": "int64", "shape": [-1, 2]}},
                    "steps": [
                        {
                            "name": "f",
                            "service": "fill",
                            "inputs": {"dims": "request.dims"},
                            "outputs": {"fill": "float32"},
                        },
                        {
                            "name": "three",
                            "transform": "concat",
                            "inputs": {"a": "f.fill", "b": "f.fill", "c": "f.fill"},
                            "outputs": ["y"],
                        },
                    ],
                    "outputs": {"y": "three.y"},
                },
            },
            {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, "workers": 2, "public": True},
        ],
    }
    proc = GatewayProcess.start(config, work / "gw")
    try:
        for name in ("cs", "fill", "echo"):
            proc.wait_workers_ready(name, 1)
        yield proc
    finally:
        proc.kill()


def _sampled(gw: GatewayProcess, path: str, body: bytes) -> tuple[tuple[int, dict[str, str], bytes], Probe]:
    """POST ``body`` to ``path`` while a probe samples the gateway, again until the probe has
    sampled the other service enough; -> (the first answer, the probe). Every answer must
    have the first one's status."""
    auth = {"Authorization": TOKEN}
    with Probe(gw, helpers=True, check_latency=False) as probe:
        first = raw_post(gw.port, path, body, auth, timeout=60)
        deadline = time.monotonic() + 60
        while len(probe.latencies) < 20 and time.monotonic() < deadline:
            assert raw_post(gw.port, path, body, auth, timeout=60)[0] == first[0]
    return first, probe


def test_a_sparse_answer_of_the_declared_shape_is_built_within_the_memory_bound(
    answers_gw: GatewayProcess,
) -> None:
    """A [3000, 3000] sparse tensor: a 36 MB dense answer, written straight from the model's
    output (a Python float per value took the gateway past 500 MB)."""
    inst = {
        "words": ["hello"],
        "image": _png_b64(4, 4),
        "tensor": [1.0, 2.0],
        "sparse": {"shape": [3000, 3000], "data": [6.5], "indices": [[4, 9]]},
    }
    body = json.dumps({"instances": [inst]}).encode()
    (status, _, answer), probe = _sampled(answers_gw, "/api/cluster-serving/cs/predict", body)
    assert status == 200, answer[:300]
    assert answer.startswith(b'{"predictions":[{') and answer.count(b"6.5") == 1
    assert 3000 * 3000 * 4 <= len(answer) < LIMIT, len(answer)
    probe.check(p99_bound_s=None)


def _fill_call(protocol: str, dims: list[int]) -> tuple[str, bytes]:
    if protocol == "cluster-serving":
        return "/api/cluster-serving/fill/predict", json.dumps({"instances": [{"dims": dims}]}).encode()
    if protocol == "v2-json":
        doc = {"inputs": [{"name": "dims", "datatype": "INT64", "shape": [1, 2], "data": dims}]}
        return "/v2/models/fill/infer", json.dumps(doc).encode()
    if protocol == "v1":
        return "/v1/models/fill:predict", json.dumps({"instances": [dims]}).encode()
    assert protocol == "paddle"
    return "/fill/prediction", json.dumps({"feed": [{"dims": dims}], "fetch": ["fill"]}).encode()


@pytest.mark.parametrize("protocol", ["cluster-serving", "v2-json", "v1", "paddle"])
def test_an_answer_past_the_limit_is_refused_before_it_is_built(
    answers_gw: GatewayProcess, protocol: str
) -> None:
    """A 36 MB model answer that is 99 to 180 MB as JSON text: 413 in the protocol's own
    error shape, naming the size, the limit and the setting, and the text never built."""
    (status, _, answer), probe = _sampled(answers_gw, *_fill_call(protocol, [3000, 3000]))
    doc = json.loads(answer)
    assert status == 413, str(doc)[:300]
    message = doc["err_msg"] if protocol == "paddle" else doc["error"]
    if protocol == "paddle":
        assert doc["err_no"] == 413, doc
    assert "the answer would be about " in message, message
    assert f"over the limit of {LIMIT} bytes" in message and "gateway.max_response_bytes" in message, message
    probe.check(p99_bound_s=None)
    # A smaller one of the same kind is answered, with every value.
    status, _, answer = raw_post(
        answers_gw.port, *_fill_call(protocol, [30, 20]), {"Authorization": TOKEN}, timeout=60
    )
    assert status == 200 and answer.count(FILL_TEXT) == 600, answer[:300]


def test_a_binary_v2_answer_under_the_limit_is_a_view_of_the_model_output(answers_gw: GatewayProcess) -> None:
    doc = {
        "inputs": [{"name": "dims", "datatype": "INT64", "shape": [1, 2], "data": [3000, 3000]}],
        "parameters": {"binary_data_output": True},
    }
    (status, headers, answer), probe = _sampled(answers_gw, "/v2/models/fill/infer", json.dumps(doc).encode())
    assert status == 200, answer[:300]
    header_length = int(headers["inference-header-content-length"])
    assert len(answer) - header_length == 3000 * 3000 * 4
    probe.check(p99_bound_s=None)


def test_a_pipeline_answer_past_the_limit_is_refused_before_it_is_encoded(answers_gw: GatewayProcess) -> None:
    """Three [2500, 2500] model outputs side by side: 75 MB as float32, about 206 MB as the
    JSON form's text: past the limit in either form."""
    body = json.dumps(
        {"inputs": {"dims": {"shape": [1, 2], "dtype": "int64", "data": [2500, 2500]}}}
    ).encode()
    (status, _, answer), probe = _sampled(answers_gw, "/api/predict/fill3", body)
    doc = json.loads(answer)
    assert (status, doc["code"]) == (413, "ResponseTooLarge"), doc
    assert "the answer would be about 2" in doc["message"], doc
    assert "gateway.max_response_bytes" in doc["message"], doc
    probe.check(p99_bound_s=None)


def _grpc_fill(gw: GatewayProcess, dims: list[int], typed: bool) -> Any:
    """One V2 gRPC call of the fill model: its answer, or the RpcError it raised."""
    port = int(yaml.safe_load((gw.workdir / "services.yaml").read_text())["gateway"]["grpc_port"])
    req = pb.ModelInferRequest(model_name="fill")
    tensor = req.inputs.add(name="dims", datatype="INT64", shape=[1, 2])
    if typed:  # KServe's client with plain lists: the answer comes in typed contents too
        tensor.contents.int64_contents.extend(dims)
    else:
        req.raw_input_contents.append(np.asarray(dims, np.int64).tobytes())
    options = [("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            return stub.ModelInfer(req, metadata=(("authorization", TOKEN),), timeout=60)
        except grpc.RpcError as exc:
            return exc


def _fill_while_probed(gw: GatewayProcess, dims: list[int], typed: bool, kind: type) -> Any:
    """The answer for ``dims``, asked for again (each answer a ``kind``) until the probe beside
    it has 20 calls, the probe then holding the gateway to its memory bound."""
    with Probe(gw, helpers=True, check_latency=False) as probe:
        first = _grpc_fill(gw, dims, typed=typed)
        deadline = time.monotonic() + 60
        while len(probe.latencies) < 20 and time.monotonic() < deadline:
            assert isinstance(_grpc_fill(gw, dims, typed=typed), kind)
    probe.check(p99_bound_s=None)
    return first


def test_a_typed_grpc_answer_is_built_within_the_memory_bound(answers_gw: GatewayProcess) -> None:
    """9 million float32 values in fp32_contents (36 MB): written from the model's output as
    the packed field's bytes (a Python float per value took the gateway past the bound)."""
    first = _fill_while_probed(answers_gw, [3000, 3000], True, pb.ModelInferResponse)
    assert isinstance(first, pb.ModelInferResponse), first
    (out,) = first.outputs
    assert (out.datatype, list(out.shape)) == ("FP32", [1, 3000, 3000]) and not first.raw_output_contents
    values = np.asarray(out.contents.fp32_contents, dtype=np.float32)
    assert values.size == 9_000_000 and bool((values == np.float32(FILL)).all())


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
def test_a_grpc_answer_past_the_limit_is_refused_before_it_is_built(
    answers_gw: GatewayProcess, typed: bool
) -> None:
    """An 81 MB answer against the 64 MB limit: RESOURCE_EXHAUSTED naming the size, the
    limit and the setting, the message never built; a smaller one of the same kind answers."""
    got = _fill_while_probed(answers_gw, [4500, 4500], typed, grpc.RpcError)
    assert isinstance(got, grpc.RpcError), got
    assert got.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, got  # type: ignore[attr-defined]
    details = got.details()  # type: ignore[attr-defined]
    assert f"over the limit of {LIMIT} bytes" in details and "gateway.max_response_bytes" in details, details
    small = _grpc_fill(answers_gw, [30, 20], typed=typed)
    assert isinstance(small, pb.ModelInferResponse), small
    if typed:
        assert list(small.outputs[0].contents.fp32_contents) == [np.float32(FILL)] * 600
    else:
        assert np.frombuffer(small.raw_output_contents[0], np.float32).tolist() == [np.float32(FILL)] * 600


def test_the_worker_refuses_an_answer_past_the_limit_before_encoding_it(answers_gw: GatewayProcess) -> None:
    """An EAS call in the JSON form for a 36 MB model output: some 180 MB as text, refused by
    the worker from its estimate; the worker's memory grows by the model's output, not by
    the text it would have written."""
    worker = psutil.Process(answers_gw.services()["fill"]["workers"][0]["pid"])
    body = json.dumps(
        {"inputs": {"dims": {"shape": [1, 2], "dtype": "int64", "data": [3000, 3000]}}}
    ).encode()
    base = peak = worker.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            with contextlib.suppress(psutil.NoSuchProcess):
                peak = max(peak, worker.memory_info().rss)
            done.wait(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        status, _, answer = raw_post(
            answers_gw.port, "/api/predict/fill", body, {"Authorization": TOKEN}, timeout=60
        )
    finally:
        done.set()
        sampler.join(5)
    doc = json.loads(answer)
    assert (status, doc["code"]) == (413, "ResponseTooLarge"), doc
    assert (
        "the answer would be about " in doc["message"] and "gateway.max_response_bytes" in doc["message"]
    ), doc
    grown_mb = (peak - base) / (1 << 20)
    print(f"fill worker RSS growth {grown_mb:.1f} MB")
    # The model's output (36 MB) and ONNX Runtime's arena for it; the text would be 180 MB more.
    assert grown_mb <= WORKER_BOUND_MB, f"the worker grew {grown_mb:.0f} MB"
