"""Direct (VPC-style) mode end to end: the real gateway with 2 workers, clients that call the
workers' own ports (found through discovery), and a worker killed with SIGKILL meanwhile."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eas_sdk import ENDPOINT_TYPE_DIRECT, PredictClient, TFRequest
from tests.e2e.gateway_proc import GatewayProcess, digits_on_workers
from tests.eas_reference import run_reference

TOKEN = "e2e-direct-token-7a1b2c3d4e5f6a7b"
REFRESH_S = 0.5  # our SDK's discovery interval in these tests (default 3 s)


def _config(model: Path) -> dict[str, Any]:
    return {
        # Fast pings: the services listing shows the workers' run counters, refreshed by them.
        "gateway": {"shutdown_timeout_s": 5, "health_interval_s": 0.2},
        "services": [digits_on_workers(model, TOKEN)],
    }


def _tf() -> TFRequest:
    req = TFRequest("serving_default")
    req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, np.full((1, 64), 0.5, dtype=np.float32))
    return req


def _gateway_requests(gw: GatewayProcess) -> float:
    """Predict calls the gateway itself answered for digits (any status)."""
    with urllib.request.urlopen(gw.url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.findall(r'^easgw_requests_total\{service="digits",status="\d+"\} (\S+)$', text, re.M)
    return sum(float(v) for v in found)


def _runs(gw: GatewayProcess) -> dict[int, int]:
    """pid -> requests run, per worker (from the workers' last health ping)."""
    return {w["pid"]: w["runs"] or 0 for w in gw.services()["digits"]["workers"] if w["pid"]}


def _wait_runs(gw: GatewayProcess, cond: Any, timeout: float = 5.0) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    runs = _runs(gw)
    while not cond(runs) and time.monotonic() < deadline:
        time.sleep(0.1)
        runs = _runs(gw)
    return runs


@pytest.mark.fault
def test_our_sdk_calls_the_workers_directly_and_drops_a_killed_one(
    gateway_factory: Any, digits_model: Path
) -> None:
    gw = gateway_factory(_config(digits_model))
    workers = gw.wait_workers_ready("digits", 2)
    pids = [w["pid"] for w in workers]
    before = _wait_runs(gw, lambda r: len(r) == 2 and all(v is not None for v in r.values()))
    through_gateway = _gateway_requests(gw)
    opts: dict[str, Any] = {
        "endpoint_type": ENDPOINT_TYPE_DIRECT,
        "token": TOKEN,
        "discovery_interval": REFRESH_S,
    }
    with (
        PredictClient(gw.endpoint, "digits", **opts) as client,
        PredictClient(gw.endpoint, "digits", retry_count=0, **opts) as no_retry,
    ):
        for _ in range(20):
            assert client.predict(_tf()).to_numpy("label").shape == (1,)
        # Both workers ran them (round robin), and none of them went through the gateway.
        after = _wait_runs(gw, lambda r: sum(r.values()) - sum(before.values()) >= 20)
        assert sum(after.values()) - sum(before.values()) == 20, (before, after)
        assert all(after[p] > before[p] for p in pids), (before, after)
        assert no_retry.predict(_tf()).to_numpy("label").shape == (1,)  # knows both workers now
        assert _gateway_requests(gw) == through_gateway

        os.kill(pids[0], signal.SIGKILL)
        failures: list[str] = []
        ok = 0
        end = time.monotonic() + 3 * REFRESH_S
        while time.monotonic() < end:  # calls right after the kill: a failed attempt is retried
            try:
                client.predict(_tf())
                ok += 1
            except Exception as exc:
                failures.append(repr(exc))
        assert failures == [] and ok > 10, failures[:3]
        # One refresh later the client without retries never picks the dead worker again.
        for _ in range(20):
            assert no_retry.predict(_tf()).to_numpy("label").shape == (1,)
    assert gw.proc.poll() is None


REFERENCE_DIRECT = r"""
import json, os, sys, time
from eas_prediction import PredictClient, PredictException, TFRequest
endpoint, token, marker, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
client = PredictClient(endpoint, "digits")
client.set_token(token)
client.set_endpoint_type("DIRECT")
client.init()
def request():
    req = TFRequest("serving_default")
    req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, [0.5] * 64)
    return req
give_up = time.time() + 30
while True:  # until the first discovery (the client's refresh thread) has found the workers
    try:
        client.predict(request()).get_values("label")
        break
    except PredictException:
        if time.time() > give_up:
            raise
        time.sleep(0.05)
ok, failed = 0, []
end = None
while end is None or time.time() < end:
    try:
        client.predict(request()).get_values("label")
        ok += 1
    except PredictException as exc:
        failed.append(str(exc)[:200])
    if end is None and ok >= 10:
        open(marker, "w").close()  # calling now: the test kills a worker
        end = time.time() + seconds
print(json.dumps({"ok": ok, "failed": failed}))
client.destroy()
"""


@pytest.mark.compat
@pytest.mark.fault
def test_reference_client_in_direct_mode_survives_a_killed_worker(
    gateway_factory: Any, digits_model: Path, tmp_path: Path
) -> None:
    """eas-prediction 0.36 refreshes its worker list every 3 s and retries a failed attempt on
    the next worker: calls across the kill and past one refresh all succeed."""
    gw = gateway_factory(_config(digits_model))
    workers = gw.wait_workers_ready("digits", 2)
    before = _wait_runs(gw, lambda r: len(r) == 2)
    marker = tmp_path / "calling"
    result: dict[str, Any] = {}

    def run() -> None:
        proc = run_reference(REFERENCE_DIRECT, gw.endpoint, TOKEN, str(marker), "4.5", timeout=60)
        result.update(json.loads(proc.stdout.decode().strip().splitlines()[-1]))

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), "the reference client never got going"
        os.kill(workers[0]["pid"], signal.SIGKILL)
    finally:
        thread.join(60)
    assert result["failed"] == [], result["failed"][:3]
    assert result["ok"] > 20
    # They were direct calls: the workers ran them, the gateway answered none.
    assert _gateway_requests(gw) == 0
    survivor = workers[1]["pid"]
    after = _wait_runs(gw, lambda r: r.get(survivor, 0) > before[survivor])
    assert after[survivor] > before[survivor]


def test_workers_listen_and_are_published_on_worker_host(gateway_factory: Any, digits_model: Path) -> None:
    """gateway.worker_host moves the workers' direct ports off the gateway's address (here to
    127.0.0.2, still loopback) and discovery publishes it, so direct clients follow."""
    import psutil

    config = _config(digits_model)
    config["gateway"]["worker_host"] = "127.0.0.2"
    gw = gateway_factory(config)
    gw.wait_workers_ready("digits", 2)
    status, doc = gw.get_json("/api/v1/servicediscovery/upstreams/digits")
    assert status == 200
    items = doc["endpoints"]["items"]
    assert len(items) == 2 and {i["ip"] for i in items} == {"127.0.0.2"}
    for pid in gw.worker_pids("digits"):
        listening = {c.laddr.ip for c in psutil.Process(pid).net_connections("tcp") if c.status == "LISTEN"}
        assert listening == {"127.0.0.2"}, listening
    before = sum(_runs(gw).values())
    with PredictClient(gw.endpoint, "digits", token=TOKEN, endpoint_type=ENDPOINT_TYPE_DIRECT) as client:
        for _ in range(6):
            assert client.predict(_tf()).to_numpy("label").shape == (1,)
    _wait_runs(gw, lambda runs: sum(runs.values()) >= before + 6)
    assert sum(_runs(gw).values()) >= before + 6
