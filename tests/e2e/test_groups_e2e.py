"""Service groups through the real gateway: calls to a group's name land on its members by
their shares (within a binomial bound that cannot flake), a reload changes the shares, and
each bad group is a config error naming its key."""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, parse_config
from tests.e2e.gateway_proc import GatewayProcess, in_threads
from tests.e2e.test_services_e2e import ADMIN_TOKEN
from tests.e2e.test_traffic_e2e import EAS_BODY, FALSE_ALARM, _admin, binomial_bounds, build_constant_model

CALLS = 2000


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("gw-groups")
    common = {"processor": "onnx", "placement": "thread", "public": True}
    config = {
        "admin": {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN},
        "services": [
            {"name": "a", "model": str(build_constant_model(workdir / "a.onnx", 1.0)), **common},
            {"name": "b", "model": str(build_constant_model(workdir / "b.onnx", 2.0)), **common},
        ],
        "groups": {"g": {"a": 70, "b": 30}},
    }
    proc = GatewayProcess.start(config, workdir)
    try:
        for name in ("a", "b"):
            proc.wait_workers_ready(name, 1)
        yield proc
    finally:
        proc.kill()


def _members(gw: GatewayProcess, n: int) -> Counter:
    """n calls to the group over four connections -> Counter of (status, the member's value)."""
    seen: Counter = Counter()
    lock = threading.Lock()

    def run(count: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
        try:
            for _ in range(count):
                conn.request(
                    "POST", "/api/predict/g", body=EAS_BODY, headers={"Content-Type": "application/json"}
                )
                resp = conn.getresponse()
                data = resp.read()
                value = json.loads(data)["outputs"]["y"]["data"][0] if resp.status == 200 else data
                with lock:
                    seen[(resp.status, value)] += 1
        finally:
            conn.close()

    in_threads(n, run)
    return seen


def test_a_group_splits_its_calls_between_its_members(gw: GatewayProcess) -> None:
    seen = _members(gw, CALLS)
    assert set(seen) <= {(200, 1.0), (200, 2.0)}, seen
    lo, hi = binomial_bounds(CALLS, 0.3, FALSE_ALARM)
    assert lo <= seen[(200, 2.0)] <= hi, (seen, lo, hi)
    # The members' own metrics count the calls that landed on them.
    _, doc = gw.get_json("/api/status")
    totals = {s["name"]: s["requests_total"] for s in doc["services"]}
    assert totals["a"] >= seen[(200, 1.0)] and totals["b"] >= seen[(200, 2.0)]


def test_a_reload_changes_the_shares(gw: GatewayProcess) -> None:
    path = gw.workdir / "services.yaml"
    config = yaml.safe_load(path.read_text())
    config["groups"] = {"g": {"a": 0, "b": 100}}
    path.write_text(yaml.safe_dump(config))
    status, done = _admin(gw, "POST", "/admin/reload")
    assert status == 200, done
    assert _members(gw, 40) == Counter({(200, 2.0): 40})


def _config(tmp_path: Path, groups: Any) -> dict[str, Any]:
    (tmp_path / "m.onnx").write_bytes(b"onnx")
    common = {"processor": "onnx", "public": True, "model": str(tmp_path / "m.onnx")}
    return {
        "services": [
            {"name": "a", **common},
            {"name": "b", **common},
            {"name": "q", "processor": "queue", "public": True},
            {
                "name": "p",
                "processor": "pipeline",
                "public": True,
                "pipeline": {
                    "inputs": {"x": {"dtype": "float32", "shape": [-1, 1]}},
                    "steps": [
                        {
                            "name": "s",
                            "service": "a",
                            "inputs": {"x": "request.x"},
                            "outputs": {"y": "float32"},
                        }
                    ],
                    "outputs": {"y": "s.y"},
                },
            },
        ],
        "groups": groups,
    }


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ({"g": {"a": 70, "b": 20}}, "groups.g: the percents add up to 90, not 100"),
        ({"g": {"a": 70, "c": 30}}, "groups.g.c: no service named 'c'"),
        ({"a": {"a": 50, "b": 50}}, "groups.a: a service is named 'a' too"),
        ({"g": {"a": 50, "q": 50}}, "groups.g.q: a queue or asynchronous service cannot be in a group"),
        ({"g": {"a": 50, "p": 50}}, "groups.g.p: a pipeline cannot be in a group"),
        ({"g": {"a": 70.5, "b": 29.5}}, "groups.g.a: expected a whole percent from 0 to 100, got 70.5"),
        ({"g": [["a", 100]]}, "groups.g: expected a mapping of services to percents"),
        ({"bad name": {"a": 100}}, "groups.bad name: a group name must match"),
    ],
)
def test_a_bad_group_is_a_config_error_naming_the_key(tmp_path: Path, groups: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(_config(tmp_path, groups))
