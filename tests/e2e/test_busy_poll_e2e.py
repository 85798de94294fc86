"""A gateway that busy-polls (``busy_poll_us``) answers every call as one that does not, for
models in its threads and on worker processes, one connection or several at once, and
goes back to sleeping once the calls stop: polling that never ended would keep a core
busy for good."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.e2e.gateway_proc import ECHO_ENTRY, GatewayProcess, in_threads
from tests.e2e.test_traffic_e2e import V2_BODY, build_constant_model
from tests.waiting import wait_until

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("gw-busy-poll")
    config = {
        # A long window (2 ms): every call of these tests comes within it of the last answer.
        "gateway": {"busy_poll_us": 2000},
        "services": [
            {"name": "plus", "processor": "onnx", "placement": "thread", "model": str(
                build_constant_model(workdir / "plus.onnx", 2.0))},
            {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, "workers": 1},
        ],
    }  # fmt: skip
    proc = GatewayProcess.start(config, workdir)
    try:
        proc.wait_workers_ready("plus", 1)
        proc.wait_workers_ready("echo", 1)
        yield proc
    finally:
        proc.kill()


def _calls(gw: GatewayProcess, count: int, tag: int) -> None:
    """``count`` calls on one kept-alive connection, each checked: the thread-placed model's
    V2 answer (x + 2) and the worker's echo in turn."""
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        for i in range(count):
            if i % 2:
                body = f"echo {tag} {i}".encode()
                conn.request("POST", "/api/predict/echo", body=body)
                resp = conn.getresponse()
                assert (resp.status, resp.read()) == (200, body)
                continue
            conn.request("POST", "/v2/models/plus/infer", body=V2_BODY, headers=JSON)
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == 200, data
            assert json.loads(data)["outputs"][0]["data"] == [2.0]
    finally:
        conn.close()


def _cpu_over(proc: psutil.Process, seconds: float) -> float:
    """The CPU seconds ``proc`` spends in the next ``seconds`` of wall time."""
    before = proc.cpu_times()
    threading.Event().wait(seconds)  # the span measured, not a wait for something
    after = proc.cpu_times()
    return (after.user - before.user) + (after.system - before.system)


def test_calls_are_answered_alike_and_the_loop_sleeps_again_once_they_stop(gw: GatewayProcess) -> None:
    _calls(gw, 300, 0)  # one at a time: each next call comes within the window
    in_threads(400, lambda n: _calls(gw, n, n))  # several connections at once
    main = psutil.Process(gw.pid)
    # Idle, the loop polls for one window after the last answer, then sleeps: a second of
    # idleness costs a sliver of a second of CPU, where endless polling would cost all of it.
    wait_until(lambda: _cpu_over(main, 1.0) < 0.3, 30, "the idle gateway to stop polling")


def test_model_answers_match_a_gateway_that_sleeps(tmp_path: Path, gw: GatewayProcess) -> None:
    # The same model and call on a gateway with polling off give the same bytes.
    config = {
        "services": [
            {"name": "plus", "processor": "onnx", "placement": "thread", "model": str(
                build_constant_model(tmp_path / "plus.onnx", 2.0))},
        ],
    }  # fmt: skip
    plain = GatewayProcess.start(config, tmp_path / "plain")
    try:
        plain.wait_workers_ready("plus", 1)
        got = [g.call_json("/v2/models/plus/infer", json.loads(V2_BODY)) for g in (gw, plain)]
        assert got[0] == got[1] and got[0][0] == 200
    finally:
        plain.kill()
