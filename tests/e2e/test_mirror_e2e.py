"""Mirroring through the real gateway: a share of a service's calls copied to another
service or to another version of its model, the copies' answers discarded and counted apart
in /metrics. A mirror that holds every copy does not hold the caller: the caller's calls
complete while the mirror still holds its copies, and past ``max_in_flight`` copies are shed,
never queued. A failing mirror fails no call of the caller's.

One python processor plays every part, told by its model file what to do: answer, raise,
or hold each call until a file appears."""

from __future__ import annotations

import http.client
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.config import ConfigError, parse_config
from tests.e2e.gateway_proc import GatewayProcess
from tests.waiting import wait_until

PROCESSOR = """
import os
import time


class Part:
    config = {}
    model_path = None

    def initialize(self):
        self.part = open(self.model_path).read().split()

    def process(self, data):
        kind = self.part[0]
        if kind == "fail":
            raise RuntimeError("the mirror fails on purpose")
        if kind == "hold":  # until the test lets the copies go (a minute at most)
            deadline = time.monotonic() + 60
            while not os.path.exists(self.part[1]) and time.monotonic() < deadline:
                time.sleep(0.01)
        return (kind + " " + self.part[-1]).encode(), 200
"""
HELD = 3  # copies the held mirror runs at once


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("gw-mirror")
    (workdir / "part.py").write_text(PROCESSOR)
    files = {
        "main": "ok main", "hold": f"hold {workdir / 'release'}", "v1": "ok v1", "v2": "fail v2",
    }  # fmt: skip
    for name, text in files.items():
        (workdir / f"{name}.txt").write_text(text)
    entry = f"{workdir / 'part.py'}:Part"
    config = {
        "gateway": {"shutdown_timeout_s": 5},
        "services": [
            {"name": "main", "processor": "python", "entry": entry, "model": str(workdir / "main.txt"),
             "mirror": {"service": "shadow", "max_in_flight": HELD}},
            {"name": "shadow", "processor": "python", "entry": entry, "model": str(workdir / "hold.txt"),
             "timeout_ms": 60000},
            {"name": "vm", "processor": "python", "entry": entry, "traffic": {1: 100, 2: 0},
             "versions": {1: str(workdir / "v1.txt"), 2: str(workdir / "v2.txt")},
             "mirror": {"version": 2, "percent": 100}},
        ],
    }  # fmt: skip
    proc = GatewayProcess.start(config, workdir)
    try:
        for name in ("main", "shadow", "vm"):
            proc.wait_workers_ready(name, 1)
        wait_until(lambda: _post(proc, "vm", {"X-Model-Version": "2"})[0] == 400, 60, "version 2 of vm ready")
        yield proc
    finally:
        (workdir / "release").touch()  # the held copies end before the gateway stops
        proc.kill()


def _post(gw: GatewayProcess, service: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        conn.request("POST", f"/api/predict/{service}", body=b"x", headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        match = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if match and match.group(1) == name:
            got = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            if all(got.get(k) == v for k, v in labels.items()):
                return float(match.group(3))
    return 0.0


def test_a_held_mirror_never_holds_the_caller_and_sheds_past_its_bound(gw: GatewayProcess) -> None:
    calls = 10
    # Every call is answered while the mirror still holds the copies it took.
    assert [_post(gw, "main") for _ in range(calls)] == [(200, b"ok main")] * calls
    assert _metric(gw, "easgw_mirror_in_flight", service="main") == HELD
    assert (
        _metric(gw, "easgw_mirror_requests_total", service="main", mirror="shadow", outcome="shed")
        == calls - HELD
    )
    assert _metric(gw, "easgw_mirror_requests_total", service="main", mirror="shadow", outcome="200") == 0
    # The mirror's copies are not the service's calls: the shadow's own counters saw none.
    assert _metric(gw, "easgw_requests_total", service="shadow") == 0
    (gw.workdir / "release").touch()
    answered = {"service": "main", "mirror": "shadow", "outcome": "200"}
    wait_until(
        lambda: _metric(gw, "easgw_mirror_requests_total", **answered) == HELD, 60, "the held copies answered"
    )
    assert _metric(gw, "easgw_mirror_in_flight", service="main") == 0
    assert _metric(gw, "easgw_mirror_dispatch_seconds_count", service="main", mirror="shadow") == HELD


def test_a_failing_mirror_version_fails_no_call_and_is_counted_apart(gw: GatewayProcess) -> None:
    failed = {"service": "vm", "mirror": "vm@2", "outcome": "400"}
    # The fixture's own calls were copied too: count from when their copies are done.
    wait_until(lambda: _metric(gw, "easgw_mirror_in_flight", service="vm") == 0, 30, "earlier copies done")
    before = _metric(gw, "easgw_mirror_requests_total", **failed)
    assert [_post(gw, "vm") for _ in range(5)] == [(200, b"ok v1")] * 5
    wait_until(
        lambda: _metric(gw, "easgw_mirror_requests_total", **failed) == before + 5, 30, "failed copies"
    )
    assert _metric(gw, "easgw_version_requests_total", service="vm", version="1", status="200") >= 5


@pytest.mark.parametrize(
    ("mirror", "message"),
    [
        ({"percent": 10}, "services[0] (m).mirror: give either version"),
        ({"version": 2, "service": "other"}, "services[0] (m).mirror: give either version"),
        ({"version": 3}, "services[0] (m).mirror.version: '3' is not a version this service serves (1, 2)"),
        ({"service": "nowhere"}, "services[0] (m).mirror.service: no service named 'nowhere'"),
        ({"service": "m"}, "services[0] (m).mirror.service: a service cannot mirror itself"),
        (
            {"version": 2, "percent": 120},
            "services[0] (m).mirror.percent: expected a number from 0 to 100, got 120",
        ),
        ({"version": 2, "max_in_flight": 0}, "services[0] (m).mirror.max_in_flight: expected a whole number"),
        ({"version": 2, "share": 5}, "services[0] (m).mirror: unknown key 'share'"),
    ],
)
def test_a_bad_mirror_is_a_config_error_naming_the_key(tmp_path: Path, mirror: dict, message: str) -> None:
    for v in (1, 2):
        (tmp_path / f"v{v}.onnx").write_bytes(b"onnx")
    versions = {v: str(tmp_path / f"v{v}.onnx") for v in (1, 2)}
    raw = {
        "services": [
            {"name": "m", "processor": "onnx", "public": True, "versions": versions, "mirror": mirror}
        ]
    }
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(raw)
