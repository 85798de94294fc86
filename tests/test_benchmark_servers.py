"""The reference servers the benchmarks run beside ours answer the SDK's calls correctly,
so a benchmark measures them doing what ours does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest

from eas_sdk import PredictClient, TFRequest
from eas_sdk.queue import QueueClient
from tests.e2e.gateway_proc import DIGITS_MODEL, GatewayProcess

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(script: str, *args: str, output: BinaryIO | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """A server under benchmarks/ listening on a free port, once it accepts connections;
    ``output``: where its stdout and stderr go."""
    port = _free_port()
    argv = [sys.executable, str(ROOT / "benchmarks" / script), str(port), *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=output, stderr=output)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"{script} did not start")
            time.sleep(0.05)


def test_the_queue_floor_server_answers_the_sdks_cycle() -> None:
    proc, port = _start("queue_floor_server.py")
    try:
        q = QueueClient(f"127.0.0.1:{port}", "q")
        q.set_token("unchecked")
        q.init()
        first, rid = q.put(b"one")  # the index as a string, as eas-prediction returns it
        second, _ = q.put(b"two")
        got = q.get(index=first, timeout="0s", auto_delete=False)
        assert [(r.index, r.data, r.tags["requestId"]) for r in got] == [(int(first), b"one", rid)]
        q.commit([first])
        assert [r.data for r in q.get(index=second, timeout="0s")] == [b"two"]  # and deleted
        assert q.attributes()["stream.length"] == "0"
        q.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_gateway_floor_server_answers_as_the_gateway_does(tmp_path: Path) -> None:
    """The floor in bench_gateway.py reaches the gateway's own worker over its RPC, gives
    the gateway's answer and writes the gateway's access line."""
    config = {
        "services": [
            {
                "name": "digits",
                "token": "floor-token-0123",
                "processor": "onnx",
                "placement": "process",
                "model": str(DIGITS_MODEL),
            }
        ]
    }
    gw = GatewayProcess.start(config, tmp_path / "gw")
    try:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        try:
            from gateway_floor_server import worker_socket  # type: ignore[import-not-found]
        finally:
            sys.path.remove(str(ROOT / "benchmarks"))
        socket_path = worker_socket(gw.worker_pids("digits")[0])
        log = (tmp_path / "floor.log").open("wb")
        floor, port = _start("gateway_floor_server.py", socket_path, "--access-log", output=log)
        try:
            req = TFRequest("predict")
            rows = np.linspace(0, 16, 3 * 64, dtype=np.float32).reshape(3, 64)
            req.add_feed("input", [3, 64], TFRequest.DT_FLOAT, rows)
            answers = []
            for endpoint, token in ((gw.url, "floor-token-0123"), (f"http://127.0.0.1:{port}", "unchecked")):
                with PredictClient(endpoint, "digits", token=token) as client:
                    resp = client.predict(req)
                answers.append((resp.to_numpy("label"), resp.to_numpy("probabilities")))
            (label, prob), (floor_label, floor_prob) = answers
            assert label.shape == (3,)
            np.testing.assert_array_equal(floor_label, label)
            np.testing.assert_array_equal(floor_prob, prob)
        finally:
            floor.terminate()
            floor.wait(timeout=10)
            log.close()
        assert "POST /api/predict/digits 200" in (tmp_path / "floor.log").read_text()
    finally:
        assert gw.stop() == 0
