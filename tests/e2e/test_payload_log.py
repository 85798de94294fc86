"""The payload log on a running gateway: CloudEvents for an EAS predict (lean front), a V2
REST and a KServe V1 call, in a JSON-lines file, an HTTP collector and a queue of the
gateway; bodies cut to their bound, credential headers never written; a sink that cannot be
reached costs the calls nothing and its drops are counted in /metrics."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import ECHO_ENTRY, GatewayProcess
from tests.waiting import wait_until


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.headers["Content-Type"], json.loads(body)))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    received: list[tuple[str, dict[str, Any]]] = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/events", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return int(exc.code), exc.read()


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _metric(gw: GatewayProcess, name: str, sink: str) -> float:
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    prefix = f'{name}{{sink="{sink}"}} '
    return next((float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


def test_calls_are_written_as_cloudevents_to_every_kind_of_sink(
    gateway_factory: Any, digits_model: Path, collector: Any, tmp_path: Path
) -> None:
    url, received = collector
    log_file = tmp_path / "logs" / "payloads.jsonl"
    dead = f"http://127.0.0.1:{_closed_port()}/events"
    config = {
        "services": [
            {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, "token": "tok",
             "payload_log": {"sink": f"file://{log_file}", "max_body_bytes": 16}},
            {"name": "digits", "processor": "onnx", "model": str(digits_model),
             "payload_log": {"sink": url}},
            {"name": "events", "processor": "queue"},
            {"name": "queued", "processor": "python", "entry": ECHO_ENTRY,
             "payload_log": {"sink": "queue:events"}},
            {"name": "lost", "processor": "python", "entry": ECHO_ENTRY, "payload_log": {"sink": dead}},
            {"name": "quiet", "processor": "python", "entry": ECHO_ENTRY,
             "payload_log": {"sink": f"file://{log_file}", "sample_rate": 0}},
        ],
    }  # fmt: skip
    gw: GatewayProcess = gateway_factory(config)
    for name in ("echo", "digits", "queued", "lost", "quiet"):
        gw.wait_workers_ready(name, 1)

    # An EAS predict through the lean front: credentials never written, the body cut to 16 bytes.
    body = b"0123456789" * 10
    secret = {"Authorization": "tok", "X-Api-Key": "k3y", "Cookie": "c=1"}
    status, answer = _post(gw.url + "/api/predict/echo", body, {**secret, "Content-Type": "text/plain"})
    assert (status, answer) == (200, body)
    request, response = wait_until(lambda: len(lines := _lines(log_file)) >= 2 and lines, 20, "two events")
    assert request["type"] == "io.easkit.inference.request" and request["specversion"] == "1.0"
    assert response["type"] == "io.easkit.inference.response"
    assert request["id"] == response["id"] == request["requestid"] != ""
    assert (request["service"], request["modelversion"], response["status"]) == ("echo", "1", 200)
    assert request["data"]["body"] == "0123456789012345"
    assert request["data"]["size"] == 100 and request["data"]["truncated"] is True
    assert response["data"]["status"] == 200 and response["data"]["size"] == 100
    headers = {k.lower() for k in request["data"]["headers"]}
    assert "content-type" in headers and not headers & {"authorization", "x-api-key", "cookie"}
    assert "tok" not in log_file.read_text() and "k3y" not in log_file.read_text()
    # A refused call is not a served one; a call to a service sampled at 0 is never written.
    assert _post(gw.url + "/api/predict/echo", b"x", {})[0] == 401
    assert _post(gw.url + "/api/predict/quiet", b"x", {})[0] == 200

    # V2 REST and KServe V1 on the model, to an HTTP collector: the tensors, as JSON.
    v2 = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
    status, _ = _post(
        gw.url + "/v2/models/digits/infer", json.dumps(v2).encode(), {"Content-Type": "application/json"}
    )
    assert status == 200
    status, _ = _post(
        gw.url + "/v1/models/digits:predict", json.dumps({"instances": [[0.0] * 64]}).encode(), {}
    )
    assert status == 200
    wait_until(lambda: len(received) >= 4, 20, "four events at the collector")
    assert {ctype for ctype, _ in received} == {"application/cloudevents+json"}
    v2_request = received[0][1]
    assert v2_request["data"]["body"]["inputs"][0]["shape"] == [1, 64]
    v2_response = received[1][1]
    assert v2_response["status"] == 200
    assert {t["name"] for t in v2_response["data"]["tensors"]} >= {"label"}
    assert received[3][1]["data"]["tensors"]

    # A queue of the gateway as the sink: its records are the events.
    assert _post(gw.url + "/api/predict/queued", b"hello", {})[0] == 200
    wait_until(
        lambda: gw.get_json("/api/services")[1] and _queue_length(gw, "events") >= 2, 20, "two records"
    )

    # A sink nobody listens on: the calls are answered all the same, the drops counted.
    for _ in range(3):
        assert _post(gw.url + "/api/predict/lost", b"x", {}) == (200, b"x")
    label = dead
    wait_until(lambda: _metric(gw, "easgw_payload_log_dropped_total", label) >= 6, 20, "six drops")
    assert _metric(gw, "easgw_payload_log_events_total", f"file:{log_file}") == 2


def _queue_length(gw: GatewayProcess, queue: str) -> float:
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    prefix = f'easgw_queue_length{{queue="{queue}"}} '
    return next((float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)), 0.0)
