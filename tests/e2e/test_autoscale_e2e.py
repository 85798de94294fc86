"""Autoscaling with the real gateway and real worker processes whose calls and starts the test
holds (tests/processors/held.py): a load step from one worker grows the pool to what the
target asks, never past ``max_workers``, and it shrinks back once the window has passed; a
scheduled bound raises the floor; a service scaled to zero answers the calls that wake it,
none dropped, the wait shown in ``Server-Timing``, and refuses past its waiting bound;
``easgw_desired_workers`` says what the gateway wants; bad settings are refused by name and
change nothing."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from eas_sdk import TFRequest
from eas_sdk.queue import QueueClient
from tests.e2e.gateway_proc import ROOT, GatewayProcess, raw_post
from tests.e2e.test_remote_workers_e2e import CLIENT_TOKEN, ROW, TTL_S, WORKER_TOKEN, Agent
from tests.waiting import wait_until

ADMIN_TOKEN = "admin-token-5d0e8c7b1a924f36"
HELD = f"{ROOT / 'tests' / 'processors' / 'held.py'}:Held"
CALLS = 8  # held at once in the load step: 4 workers' worth at target 2, capped at 3


def _service(name: str, config: dict[str, Any], autoscale: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "processor": "python",
        "public": True,
        "entry": HELD,
        "config": config,
        "timeout_ms": 90_000,
        "autoscale": autoscale,
    }


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("autoscale")
    release, gate, queued = tmp / "release", tmp / "gate", tmp / "queued"
    gate.touch()  # the first workers start freely
    services = {
        "held": _service(
            "held",
            {"release": str(release)},
            {"min_workers": 1, "max_workers": 3, "target": 2, "scale_down_after_s": 2},
        ),
        "cold": _service(
            "cold",
            {"start_gate": str(gate)},
            {
                "min_workers": 0,
                "max_workers": 2,
                "target": 4,
                "idle_after_s": 1,
                "scale_down_after_s": 0,
                "max_waiting": 3,
            },
        ),
        "queued": {
            **_service(
                "queued",
                {"release": str(queued)},
                {"min_workers": 1, "max_workers": 3, "target": 2, "scale_down_after_s": 1},
            ),
            "async": True,
            "max_pending": 2,  # two records at the workers at most: the rest wait in the queue
        },
    }
    config = {
        "admin": {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN},
        "gateway": {"shutdown_timeout_s": 5},
        "services": list(services.values()),
    }
    gw = GatewayProcess.start(config, tmp / "gw")
    try:
        yield {"gw": gw, "release": release, "gate": gate, "queued": queued, "services": services}
    finally:
        release.touch()
        queued.touch()
        gate.touch()
        gw.stop()


def _call(gw: GatewayProcess, service: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    return raw_post(gw.port, f"/api/predict/{service}", body, {}, timeout=120)


def _running(gw: GatewayProcess, service: str) -> list[dict[str, Any]]:
    return [w for w in gw.services()[service].get("workers", []) if w["state"] not in ("draining", "stopped")]


def _ready(gw: GatewayProcess, service: str) -> int:
    return sum(1 for w in gw.services()[service].get("workers", []) if w["state"] == "ready")


def _desired(gw: GatewayProcess, service: str) -> float | None:
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.findall(rf'^easgw_desired_workers{{service="{service}"}} (\S+)$', text, re.M)
    return float(found[0]) if found else None


def _admin(gw: GatewayProcess, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
    [url] = re.findall(r"admin API listening on (http://\S+)", gw.output())[-1:]
    req = urllib.request.Request(
        url + path,
        data=None if doc is None else json.dumps(doc).encode(),
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"null")


def test_a_load_step_grows_the_pool_to_the_target_and_it_shrinks_after_the_window(
    env: dict[str, Any],
) -> None:
    gw = env["gw"]
    gw.wait_workers_ready("held", 1)
    assert len(_running(gw, "held")) == 1
    wait_until(lambda: _desired(gw, "held") == 1, 30, "the desired workers of an idle service: its minimum")
    seen: list[int] = []

    def grown() -> bool:
        seen.append(len(_running(gw, "held")))
        return _ready(gw, "held") == 3

    with ThreadPoolExecutor(CALLS) as pool:
        calls: list[Future[tuple[int, dict[str, str], bytes]]] = [
            pool.submit(_call, gw, "held", f"x{i}".encode()) for i in range(CALLS)
        ]
        wait_until(grown, 90, "three ready workers under the load step")
        # ceil(8 calls / target 2) = 4, capped at max_workers.
        assert _desired(gw, "held") == 3
        assert _admin(gw, "GET", "/admin/services/held")[1]["desired_workers"] == 3
        env["release"].touch()
        answers = [c.result(timeout=120) for c in calls]
    assert [(status, body) for status, _, body in answers] == [
        (200, f"held:x{i}".encode()) for i in range(CALLS)
    ]
    wait_until(lambda: len(gw.services()["held"]["workers"]) == 1, 90, "the pool back at one worker")
    assert max(seen) <= 3, seen
    assert _desired(gw, "held") == 1


def test_a_scheduled_bound_raises_the_floor_and_bad_settings_are_refused_by_name(env: dict[str, Any]) -> None:
    gw, spec = env["gw"], env["services"]["held"]
    every_minute = {**spec["autoscale"], "schedule": [{"cron": "* * * * *", "min_workers": 2}]}
    status, doc = _admin(gw, "PUT", "/admin/services/held", {**spec, "autoscale": every_minute})
    assert status == 200, doc
    wait_until(lambda: _ready(gw, "held") == 2, 90, "two ready workers from the scheduled floor")
    assert _desired(gw, "held") == 2

    bad = {
        "autoscale.min_workers": {"min_workers": 3, "max_workers": 2},
        "autoscale.target": {"target": 0},
        "autoscale.schedule[0].cron": {"schedule": [{"cron": "61 * * * *", "max_workers": 2}]},
    }
    for key, autoscale in bad.items():
        status, doc = _admin(gw, "PUT", "/admin/services/held", {**spec, "autoscale": autoscale})
        assert status == 400 and key in doc["message"], (key, doc)
        status, doc = _admin(gw, "POST", "/admin/services", {**spec, "name": "other", "autoscale": autoscale})
        assert status == 400 and key in doc["message"], (key, doc)
    # The same from the config file: the reload is refused, naming the key.
    path = gw.workdir / "services.yaml"
    good = path.read_text()
    broken = yaml.safe_load(good)
    broken["services"][0]["autoscale"] = {"min_workers": 2, "max_workers": 1}
    path.write_text(yaml.safe_dump(broken))
    try:
        status, doc = _admin(gw, "POST", "/admin/reload")
    finally:
        path.write_text(good)
    assert status == 400, doc
    assert doc["message"].startswith(
        "reload refused, the running services stay: services[0] (held).autoscale"
    ), doc
    status, doc = _admin(gw, "GET", "/admin/services/held")
    assert doc["spec"]["autoscale"]["schedule"] == every_minute["schedule"]  # the running one, unchanged
    assert _ready(gw, "held") == 2
    assert "other" not in gw.services()

    status, doc = _admin(gw, "PUT", "/admin/services/held", spec)
    assert status == 200, doc
    wait_until(lambda: len(gw.services()["held"]["workers"]) == 1, 90, "the pool back at one worker")


def test_a_service_scaled_to_zero_answers_the_calls_that_wake_it(env: dict[str, Any]) -> None:
    gw, gate = env["gw"], env["gate"]
    wait_until(lambda: not gw.services()["cold"].get("workers"), 90, "the idle service scaled to zero")
    assert _desired(gw, "cold") == 0
    # Scaled to zero is ready: a call starts a worker.
    assert gw.services()["cold"]["ready"] is True
    gate.unlink()  # the next worker's start waits for the test
    with ThreadPoolExecutor(3) as pool:
        calls = [pool.submit(_call, gw, "cold", f"c{i}".encode()) for i in range(3)]
        try:
            wait_until(
                lambda: _admin(gw, "GET", "/admin/services/cold")[1]["in_flight"] == 3,
                30,
                "three calls waiting",
            )
            assert [w["state"] for w in gw.services()["cold"]["workers"]] == ["starting"]
            wait_until(lambda: _desired(gw, "cold") == 1, 10, "one worker wanted")
            # Past max_waiting: refused at once, saying why.
            status, _, body = _call(gw, "cold", b"one too many")
            assert status == 503 and b"max_waiting" in body, body
        finally:
            gate.touch()
        answers = [c.result(timeout=120) for c in calls]
    for i, (status, headers, body) in enumerate(answers):
        assert (status, body) == (200, f"held:c{i}".encode()), (status, body)
        assert re.fullmatch(r"cold-start;dur=\d+(\.\d+)?", headers.get("server-timing", "")), headers


def test_an_asynchronous_service_scales_on_the_records_waiting_in_its_queue(env: dict[str, Any]) -> None:
    gw = env["gw"]
    gw.wait_workers_ready("queued", 1)
    with QueueClient(gw.endpoint, "queued") as q:
        q.init()
        for i in range(6):  # the one worker holds what it takes; the rest wait in the queue
            q.put(f"r{i}".encode())
    # Two records held at the workers and four in the queue: ceil(6 / 2) workers.
    wait_until(lambda: _ready(gw, "queued") == 3, 90, "three ready workers for the queued records")
    assert _desired(gw, "queued") == 3
    env["queued"].touch()
    with QueueClient(gw.endpoint, "queued/sink") as sink:
        sink.init()
        wait_until(lambda: int(sink.attributes().get("stream.length", 0)) == 6, 60, "six results in the sink")
        records = sink.get(length=6)
    assert sorted(bytes(r.data) for r in records) == [f"held:r{i}".encode() for i in range(6)]
    wait_until(lambda: len(gw.services()["queued"]["workers"]) == 1, 90, "the pool back at one worker")


def test_a_remote_only_service_at_zero_asks_for_a_worker_and_its_call_waits_for_one(
    gateway_factory: Any, digits_model: Path, tmp_path: Path
) -> None:
    """What KEDA scaling a worker Deployment to zero and back sees: the gauge goes to 0 when
    idle, to 1 while a call waits, and the call is answered once a worker joins."""
    gw = gateway_factory({
        "services": [{
            "name": "digits", "processor": "onnx", "model": str(digits_model), "token": CLIENT_TOKEN,
            "workers": 0, "remote_workers": {"token": WORKER_TOKEN, "ttl_s": TTL_S}, "timeout_ms": 60_000,
            "autoscale": {"min_workers": 0, "max_workers": 3, "target": 1, "idle_after_s": 0.5},
        }],
    })  # fmt: skip
    wait_until(lambda: _desired(gw, "digits") == 0, 30, "no worker wanted while idle")
    req = TFRequest("serving_default")
    req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, ROW)
    agents: list[Agent] = []
    try:
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(
                raw_post, gw.port, "/api/predict/digits", req.to_string(), {"Authorization": CLIENT_TOKEN},
                timeout=120,
            )  # fmt: skip
            wait_until(lambda: _desired(gw, "digits") == 1, 30, "one worker wanted for the waiting call")
            assert not call.done()
            agents.append(Agent(gw, tmp_path / "host-a"))  # what the orchestrator starts
            status, headers, _ = call.result(timeout=120)
        assert status == 200
        assert headers.get("server-timing", "").startswith("cold-start;dur="), headers
    finally:
        for agent in agents:
            agent.stop()
