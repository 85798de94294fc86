"""Remote workers: ``eas-gateway worker`` processes joining a gateway's service over TCP.

Gateway and workers run as separate processes with their own directories and ports, as
if on different hosts; calls go through the real SDK with its retries on, and the
workers are killed, stopped and restarted under that load.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from eas_sdk import PredictClient, TFRequest
from tests.e2e.gateway_proc import GatewayProcess, thread_policies

CLIENT_TOKEN = "client-token-0123456789"
WORKER_TOKEN = "worker-secret-0123456789abcdef"
TTL_S = 1.5
ROW = np.linspace(0, 16, 64, dtype=np.float32).reshape(1, 64)


class Agent:
    """One ``eas-gateway worker`` process, in its own directory and process group."""

    def __init__(self, gw: GatewayProcess, workdir: Path, token: str = WORKER_TOKEN) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "worker.log"
        argv = [
            sys.executable, "-m", "gateway", "worker", "--gateway", gw.url, "--service", "digits",
            "--host", "127.0.0.1", "--heartbeat", "0.3",
        ]  # fmt: skip
        env = {**os.environ, "EAS_WORKER_TOKEN": token, "PYTHONUNBUFFERED": "1"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _tf() -> TFRequest:
    req = TFRequest("serving_default")
    req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, ROW)
    return req


def _workers(gw: GatewayProcess) -> list[dict[str, Any]]:
    return [w for w in gw.services()["digits"].get("workers", []) if w.get("remote")]


def _wait(pred: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"not {what} after {timeout} s")


def _ready(gw: GatewayProcess) -> int:
    return sum(1 for w in _workers(gw) if w["state"] == "ready")


@pytest.fixture
def gw(gateway_factory: Any, digits_model: Path) -> GatewayProcess:
    cfg = {
        "gateway": {"health_interval_s": 0.2},
        "services": [
            {
                "name": "digits",
                "processor": "onnx",
                "model": str(digits_model),
                "token": CLIENT_TOKEN,
                "workers": 0,
                "remote_workers": {"token": WORKER_TOKEN, "ttl_s": TTL_S},
            }
        ],
    }
    return gateway_factory(cfg)  # type: ignore[no-any-return]


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for a in started:
        a.stop()


def test_remote_workers_serve_survive_kills_and_leave_cleanly(
    gw: GatewayProcess, agents: list[Agent], tmp_path: Path, digits_model: Path
) -> None:
    # A service with no worker of its own starts at once and says why it is not ready.
    status, _ = gw.get_json("/readyz")
    assert status == 503
    agents += [Agent(gw, tmp_path / "host-a"), Agent(gw, tmp_path / "host-b")]
    _wait(lambda: _ready(gw) == 2, "two remote workers ready")

    # Under the same scheduling policy as a gateway's own workers (the default, batch).
    for agent in agents:
        assert thread_policies(agent.proc.pid) == {os.SCHED_BATCH}

    # They take traffic, and answer what ONNX Runtime answers.
    expected = ort.InferenceSession(str(digits_model)).run(None, {"input": ROW})
    with PredictClient(gw.url, "digits", token=CLIENT_TOKEN) as client:
        resp = client.predict(_tf())
    assert int(resp.get_values("label")[0]) == int(expected[0][0])

    # Discovery publishes them for direct calls, which check the client token.
    status, doc = gw.get_json("/api/v1/servicediscovery/upstreams/digits")
    items = doc["endpoints"]["items"]
    assert status == 200 and len(items) == 2
    direct = f"http://{items[0]['ip']}:{items[0]['port']}/api/predict/digits"
    body = _tf().to_string()
    req = urllib.request.Request(direct, data=body, headers={"Authorization": CLIENT_TOKEN})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(direct, data=body), timeout=5)
    info.value.close()
    assert info.value.code == 401

    # Under continuous load with retries on: kill -9 one worker, start a new one, stop the
    # other cleanly (SIGTERM: it deregisters first). No call fails.
    failures: list[BaseException] = []
    calls = [0]
    done = threading.Event()

    def load() -> None:
        with PredictClient(gw.url, "digits", token=CLIENT_TOKEN) as client:
            client.set_retry_count(5)
            while not done.is_set():
                try:
                    client.predict(_tf())
                    calls[0] += 1
                except Exception as exc:  # counted, not raised in the thread
                    failures.append(exc)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        _wait(lambda: calls[0] >= 30, "calls flowing before the kill")
        agents[0].signal(signal.SIGKILL)
        _wait(lambda: _ready(gw) == 1, "the killed worker out of routing", timeout=10)
        agents.append(Agent(gw, tmp_path / "host-c"))
        _wait(lambda: _ready(gw) == 2, "a new worker ready")
        agents[1].signal(signal.SIGTERM)
        assert agents[1].proc.wait(15) == 0, agents[1].output()[-2000:]
        _wait(lambda: _ready(gw) == 1, "the stopped worker gone")
        after = calls[0]
        _wait(lambda: calls[0] >= after + 30, "calls on the worker left")
    finally:
        done.set()
        for t in threads:
            t.join(30)
    assert not failures, failures[:3]
    assert WORKER_TOKEN not in agents[2].output() and WORKER_TOKEN not in gw.output()

    # A worker that stops heart-beating (SIGSTOP) is removed within its ttl; once it
    # comes back it registers again and takes traffic.
    agents[2].signal(signal.SIGSTOP)
    # Within a few ttls (generous for a loaded machine); a worker kept for good is not removed.
    _wait(lambda: not _workers(gw), "the silent worker removed", timeout=6 * TTL_S)
    agents[2].signal(signal.SIGCONT)
    _wait(lambda: _ready(gw) == 1, "the worker back")


def test_registration_needs_the_worker_token(gw: GatewayProcess, agents: list[Agent], tmp_path: Path) -> None:
    url = f"{gw.url}/api/v1/workers/digits"
    reg = json.dumps({"id": "x", "ipc": "tcp://127.0.0.1:9", "http": "127.0.0.1:9"}).encode()
    for token in ("", CLIENT_TOKEN, "Bearer wrong-worker-token-000000"):
        req = urllib.request.Request(url, data=reg, headers={"Authorization": token} if token else {})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=5)
        with info.value:
            assert info.value.code == 401
            assert json.loads(info.value.read())["code"] == "Unauthorized"
    # A worker started with a wrong token gives up with a clear message and joins nothing.
    bad = Agent(gw, tmp_path / "bad", token="wrong-worker-token-000000")
    agents.append(bad)
    assert bad.proc.wait(30) == 2
    assert "401" in bad.output() and "wrong-worker-token" not in bad.output()
    assert not _workers(gw)
    # Bad registrations are refused with the reason.
    req = urllib.request.Request(
        url, data=b'{"id": "x", "ipc": "nowhere"}', headers={"Authorization": f"Bearer {WORKER_TOKEN}"}
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    with info.value:
        assert info.value.code == 400 and "ipc" in json.loads(info.value.read())["message"]


def test_the_worker_refuses_a_connection_without_the_token(
    gw: GatewayProcess, agents: list[Agent], tmp_path: Path
) -> None:
    import socket

    agents.append(Agent(gw, tmp_path / "host-a"))
    _wait(lambda: _ready(gw) == 1, "a remote worker ready")
    host, port = _workers(gw)[0]["remote"].removeprefix("tcp://").rsplit(":", 1)
    # A frame that is not the HELLO: the worker closes the connection without answering.
    from gateway.codecs.ipc import HEADER, PING

    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(HEADER.pack(0, 1, PING))
        assert s.recv(64) == b""
    assert _ready(gw) == 1  # the gateway's own connections are unaffected
