"""Honest readiness against the real gateway: a model that cannot load and an ``initialize()``
that raises are not ready, say why on /readyz, /api/services, the EAS and V2 paths, back off,
and are logged once per change with true durations; a queue call to a predict service is
refused saying so."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from eas_sdk import PredictClient, PredictException, QueueClient, StringRequest
from eas_sdk._core.constants import HEADER_QUEUE_UID
from tests.e2e.gateway_proc import ECHO_ENTRY, GatewayProcess

BOOM = """
class Boom:
    def initialize(self):
        raise RuntimeError("cannot reach the feature store")

    def process(self, data):
        return data
"""
V2_BODY = b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}'


def _call(
    url: str, body: bytes | None = None, headers: dict[str, str] | None = None, method: str = "POST"
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), exc.read()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("readiness")
    bad = tmp / "corrupt.onnx"
    bad.write_bytes(b"this is not an onnx model")
    (tmp / "boom.py").write_text(BOOM, encoding="utf-8")
    config: dict[str, Any] = {
        # The default 60 s start timeout: the log must not claim it waited that long.
        "gateway": {"restart_backoff_max_s": 2},
        "services": [
            {
                "name": "broken",
                "processor": "onnx",
                "placement": "process",
                "public": True,
                "model": str(bad),
            },
            {"name": "boom", "processor": "python", "public": True, "entry": f"{tmp / 'boom.py'}:Boom"},
            {"name": "echo", "processor": "python", "public": True, "entry": ECHO_ENTRY},
            {"name": "q", "processor": "queue", "public": True, "workers": 0},
        ],
    }
    proc = GatewayProcess.start(config, tmp / "gw")
    try:
        yield proc
    finally:
        proc.kill()


def test_readyz_names_each_cause(gw: GatewayProcess) -> None:
    status, body = gw.get_json("/readyz")
    assert status == 503
    assert body["services"] == {"broken": False, "boom": False, "echo": True, "q": True}
    assert set(body["reasons"]) == {"broken", "boom"}
    assert body["reasons"]["boom"].startswith(
        "its workers failed to start: initialize() raised RuntimeError: cannot reach the feature store"
    )
    status, one = gw.get_json("/readyz?service=broken")
    assert status == 503 and one["ready"] is False
    assert one["reason"].startswith("its workers failed to start: ")
    assert "corrupt.onnx" in one["reason"] and str(gw.workdir.parent) not in one["reason"]
    assert gw.get_json("/readyz?service=echo") == (200, {"ready": True, "service": "echo"})
    listed = gw.services()
    assert listed["boom"]["ready"] is False and "feature store" in listed["boom"]["reason"]
    assert "reason" not in listed["echo"]


def test_calls_get_503_naming_the_cause_in_each_protocol(gw: GatewayProcess) -> None:
    status, headers, body = _call(gw.url + "/api/predict/boom", b"x")
    assert status == 503
    doc = json.loads(body)
    assert doc["code"] == "ServiceNotReady"
    assert doc["message"].startswith(
        "service boom is not ready: its workers failed to start: "
        "initialize() raised RuntimeError: cannot reach the feature store"
    )
    assert 1 <= int(headers["Retry-After"]) <= 2  # the next attempt, within the back-off cap
    # Cluster Serving: its own {"error"} shape, with the cause.
    status, _, body = _call(gw.url + "/api/cluster-serving/broken/predict", b'{"instances": [{"x": [1.0]}]}')
    assert status == 503
    message = json.loads(body)["error"]
    assert message.startswith("service broken is not ready: its workers failed to start: ")
    v1_body = b'{"instances": [[1.0]]}'
    for path, doc in (("/v2/models/broken/infer", V2_BODY), ("/v1/models/broken:predict", v1_body)):
        status, _, body = _call(gw.url + path, doc)
        error = json.loads(body)["error"]
        assert status == 503, path
        # V2 and V1 name the cause too, in KServe's own error shape.
        assert "broken" in error and "its workers failed to start: " in error and "corrupt.onnx" in error, (
            path
        )
    assert gw.get_json("/v2/models/broken/ready")[0] == 503
    assert _call(gw.url + "/api/predict/echo", b"fine")[:3:2] == (200, b"fine")


def test_restarts_back_off_and_the_log_says_it_once(gw: GatewayProcess) -> None:
    deadline = time.monotonic() + 20
    while gw.services()["boom"]["restarts"] < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gw.services()["boom"]["restarts"] >= 3
    out = gw.output()
    failures = re.findall(r"service boom: worker 0 failed to start after ([\d.]+) s: (.*)", out)
    assert len(failures) == 1, failures  # three attempts, one line: the error did not change
    # The worker's own account, with the traceback of initialize(), comes once too.
    assert out.count("service boom: processor failed to load: initialize() raised RuntimeError") == 1
    assert 'raise RuntimeError("cannot reach the feature store")' in out
    # What it says it waited is the attempt's own time (seconds), not the 60 s start timeout:
    # half that timeout is the line between them, slack enough for a loaded machine.
    assert float(failures[0][0]) < 30
    assert "cannot reach the feature store" in failures[0][1]
    # The start-up summary says how long it really waited (not the 60 s start timeout).
    waited = re.search(r"service boom is not ready after ([\d.]+) s: its workers failed to start", out)
    assert waited is not None and float(waited.group(1)) < 30, out[-3000:]


def test_a_queue_call_to_a_predict_service_is_refused_saying_so(gw: GatewayProcess) -> None:
    for method, body in (("POST", b"record"), ("GET", None)):
        status, _, reply = _call(gw.url + "/api/predict/echo", body, {HEADER_QUEUE_UID: "u1"}, method)
        assert status == 400, (method, reply)
        doc = json.loads(reply)
        assert doc["code"] == "WrongServiceKind"
        assert "is a synchronous predict service, not a queue" in doc["message"]


def test_a_predict_client_pointed_at_a_queue_is_refused_saying_so(gw: GatewayProcess) -> None:
    client = PredictClient(gw.endpoint, "q")
    client.init()
    try:
        with pytest.raises(PredictException) as exc:
            client.predict(StringRequest("meant for a model"))
    finally:
        client.destroy()
    assert exc.value.code == 400
    doc = json.loads(exc.value.body)
    assert doc["code"] == "WrongServiceKind" == exc.value.error_code
    assert doc["message"].startswith("service 'q' is a queue, not a predict service: put records with")
    queue = QueueClient(gw.endpoint, "q")
    queue.init()
    try:
        index, _ = queue.put(b"a record")  # nothing was stored by the refused call
        assert index == "1"
    finally:
        queue.destroy()
    assert _call(gw.url + "/api/predict/q", b"plain HTTP still enqueues")[0] == 200
