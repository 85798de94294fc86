"""Services managed while the gateway runs, through the real CLI and admin API: created,
called over EAS, V1 and V2, scaled 1 -> 3 -> 1 and rolled to a new model version under
load from the real eas-prediction client with no failed call, deleted, and found again
after a restart."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from eas_sdk import PredictClient, TFRequest
from tests.e2e.estimator_models import tiny_pickle
from tests.e2e.gateway_proc import ECHO_ENTRY, ROOT, GatewayProcess
from tests.e2e.reference_load import ReferenceLoad

ADMIN_TOKEN = "admin-token-7c2e9a41d0b35f68"


def admin_url(gw: GatewayProcess) -> str:
    found = re.findall(r"admin API listening on (http://\S+)", gw.output())
    assert found, gw.output()[-2000:]
    return str(found[-1])  # the log files are appended to across restarts


def cli(gw: GatewayProcess, *args: str, token: str | None = ADMIN_TOKEN) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EAS_ADMIN_URL": admin_url(gw)}
    env.pop("EAS_ADMIN_TOKEN", None)
    if token:
        env["EAS_ADMIN_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def http(
    url: str, body: bytes | None = None, headers: dict[str, str] | None = None, method: str | None = None
) -> tuple[int, Any]:
    """-> (status, the JSON answer), an error's included; a POST when there is a body, unless
    ``method`` says otherwise."""
    req = urllib.request.Request(
        url, data=body, headers=headers or {}, method=method or ("POST" if body else "GET")
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"null")


def failures_of(gw: GatewayProcess, service: str) -> dict[str, float]:
    """easgw_requests_total samples of ``service`` whose status is not 200."""
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    pattern = rf'easgw_requests_total{{service="{service}",status="(\d+)"}} (\S+)'
    return {status: float(n) for status, n in re.findall(pattern, text) if status != "200"}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("services")
    (tmp / "models").mkdir()
    shutil.copy(digits_model, tmp / "models" / "digits-v1.onnx")
    shutil.copy(digits_model, tmp / "models" / "digits-v2.onnx")
    config = {
        "admin": {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN},
        "gateway": {"shutdown_timeout_s": 10, "restart_backoff_max_s": 2},
        "services": [{"name": "echo", "processor": "python", "public": True, "entry": ECHO_ENTRY}],
    }
    state: dict[str, Any] = {"tmp": tmp, "config": config}
    state["gw"] = GatewayProcess.start(config, tmp / "gw")
    try:
        yield state
    finally:
        state["gw"].kill()


def broken_model_spec(tmp: Path, service: str, stem: str) -> Path:
    """A spec of ``service`` whose model, ``models/STEM.onnx``, is not a model: its workers
    cannot start."""
    bad = tmp / "models" / f"{stem}.onnx"
    bad.write_bytes(b"not a model")
    spec = tmp / f"{stem}.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"name": service, "processor": "onnx", "placement": "process", "public": True, "model": str(bad)}
        )
    )
    return spec


def _tf() -> TFRequest:
    req = TFRequest("serving_default")
    req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, np.full((1, 64), 0.5, dtype=np.float32))
    return req


def test_admin_api_needs_its_token(env: dict[str, Any]) -> None:
    gw = env["gw"]
    status, body = http(admin_url(gw) + "/admin/services")
    assert status == 401 and body["code"] == "Unauthorized"
    status, body = http(admin_url(gw) + "/admin/services", headers={"Authorization": "Bearer nope"})
    assert status == 401
    out = cli(gw, "services", "list", token=None)
    assert out.returncode == 1 and "Unauthorized: invalid or missing admin token" in out.stderr
    # The main listener does not serve the admin API.
    assert http(gw.url + "/admin/services")[0] == 404
    status, doc = http(admin_url(gw) + "/admin/openapi.json")
    assert status == 200 and "/admin/services/{name}/scale" in doc["paths"]


def test_create_call_scale_roll_delete_restart(env: dict[str, Any]) -> None:
    gw, tmp = env["gw"], env["tmp"]
    spec = tmp / "digits2.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "digits2",
                "processor": "onnx",
                "placement": "process",
                "public": True,
                "model": "models/digits-v1.onnx",
            }
        )
    )
    out = cli(gw, "services", "create", "-f", str(spec))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "service digits2 created (1/1 workers ready; ready)"
    keeper = tmp / "keeper.json"
    keeper.write_text(
        json.dumps(
            {"name": "keeper", "processor": "python", "public": True, "entry": ECHO_ENTRY, "workers": 2}
        )
    )
    assert cli(gw, "services", "create", "-f", str(keeper)).returncode == 0
    again = cli(gw, "services", "create", "-f", str(keeper))
    assert again.returncode == 1 and "Conflict: service 'keeper' already exists" in again.stderr

    # Called over EAS (this SDK), V2 and V1 at once.
    client = PredictClient(gw.endpoint, "digits2")
    client.init()
    label = int(client.predict(_tf()).get_values("label")[0])
    client.destroy()
    row = [0.5] * 64
    v2 = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": row}]}
    status, doc = http(gw.url + "/v2/models/digits2/infer", json.dumps(v2).encode())
    assert status == 200 and {o["name"]: o["data"] for o in doc["outputs"]}["label"] == [label]
    status, doc = http(gw.url + "/v1/models/digits2:predict", json.dumps({"instances": [row]}).encode())
    assert status == 200 and doc["predictions"][0]["label"] == label

    listing = cli(gw, "services", "list")
    assert listing.returncode == 0
    lines = {line.split()[0]: line.split() for line in listing.stdout.splitlines()[1:]}
    assert lines["digits2"][:5] == ["digits2", "onnx", "process", "yes", "1/1"]
    assert lines["keeper"][:5] == ["keeper", "python", "process", "yes", "2/2"]

    # Load from eas-prediction while the service is scaled 1 -> 3 -> 1 and rolled to v2.
    load = ReferenceLoad.start(gw.endpoint, "digits2", tmp)
    try:
        load.wait_calls(50)  # flowing before any change
        up = cli(gw, "services", "scale", "digits2", "3")
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == "service digits2 scaled to 3 worker(s) (3/3 ready)"
        load.wait_calls(50)  # answered on three workers
        pids = {w["pid"] for w in gw.services()["digits2"]["workers"]}
        down = cli(gw, "services", "scale", "digits2", "1")
        assert down.returncode == 0 and "(1/1 ready)" in down.stdout, down.stderr
        load.wait_calls(50)  # answered again on one
        spec.write_text(
            yaml.safe_dump(
                {
                    "name": "digits2",
                    "processor": "onnx",
                    "placement": "process",
                    "public": True,
                    "model": "models/digits-v2.onnx",
                }
            )
        )
        roll = cli(gw, "services", "update", "-f", str(spec))
        assert roll.returncode == 0, roll.stderr
        load.wait_calls(50)  # calls on the new version too
    finally:
        result = load.finish()
    assert result["failed"] == [], result["failed"][:5]
    assert failures_of(gw, "digits2") == {}
    # How fast is not asserted: the scale and the roll start ONNX Runtime workers on the
    # cores the load runs on, so the rate through them follows what else the machine runs
    # (over 700/s alone, under 150/s beside a busy core). What is asserted is that every
    # call was answered and calls went on being answered after each change.
    print(f"eas-prediction in scale and roll: {result['ok']} calls, {result['rate']:.0f}/s")
    now = gw.services()["digits2"]
    assert now["ready"] and len(now["workers"]) == 1
    assert now["workers"][0]["pid"] not in pids  # the rolled worker is a new process
    status, got = http(
        admin_url(gw) + "/admin/services/digits2", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert status == 200 and got["spec"]["model"] == str(tmp / "models" / "digits-v2.onnx")

    # Delete: 404 from then on, on every path.
    out = cli(gw, "services", "delete", "digits2")
    assert out.returncode == 0 and out.stdout.strip() == "service digits2 deleted"
    assert http(gw.url + "/api/predict/digits2", b"x")[0] == 404
    assert http(gw.url + "/v2/models/digits2")[0] == 404
    missing = cli(gw, "services", "get", "digits2")
    assert missing.returncode == 1 and "ServiceNotFound" in missing.stderr

    # Restart: the file's service and the managed ones are back; the deleted one is not.
    assert gw.stop() == 0
    gw = env["gw"] = GatewayProcess.start(env["config"], tmp / "gw")
    names = gw.services()
    assert set(names) == {"echo", "keeper"}
    gw.wait_workers_ready("keeper", 2)
    req = urllib.request.Request(gw.url + "/api/predict/keeper", data=b"back", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.read() == b"back"


def test_update_to_a_broken_model_keeps_the_running_version(env: dict[str, Any]) -> None:
    gw, tmp = env["gw"], env["tmp"]
    spec = broken_model_spec(tmp, "echo", "broken")
    out = cli(gw, "services", "update", "-f", str(spec))
    assert out.returncode == 1
    assert (
        "RolloutFailed: the new version of service echo did not start: its workers failed to start"
        in out.stderr
    )
    assert "broken.onnx" in out.stderr
    req = urllib.request.Request(gw.url + "/api/predict/echo", data=b"still here", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.read() == b"still here"
    invalid = tmp / "invalid.yaml"
    invalid.write_text(yaml.safe_dump({"name": "x", "processor": "onnx", "public": True, "workers": 0}))
    out = cli(gw, "services", "create", "-f", str(invalid))
    assert out.returncode == 1
    assert "BadRequest: service (x).model: expected a non-empty string" in out.stderr
    assert "service (x).workers: must be >= 1, got 0" in out.stderr


def test_a_versioned_service_is_created_rolled_and_deleted_whole(env: dict[str, Any]) -> None:
    gw, tmp = env["gw"], env["tmp"]
    models = tmp / "models"
    spec = tmp / "versioned.yaml"
    versions = {1: str(models / "digits-v1.onnx"), 2: str(models / "digits-v2.onnx")}
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "vers",
                "processor": "onnx",
                "placement": "process",
                "public": True,
                "versions": versions,
            }
        )
    )
    out = cli(gw, "services", "create", "-f", str(spec))
    assert out.returncode == 0, out.stderr
    for version in ("1", "2"):
        assert http(gw.url + f"/v2/models/vers/versions/{version}/ready")[0] == 200, version
    three = {**versions, 3: versions[2]}
    spec.write_text(
        yaml.safe_dump(
            {"name": "vers", "processor": "onnx", "placement": "process", "public": True, "versions": three}
        )
    )
    assert cli(gw, "services", "update", "-f", str(spec)).returncode == 0
    assert http(gw.url + "/v2/models/vers/versions/3/ready")[0] == 200
    assert http(gw.url + "/v2/models/vers/versions/1/ready")[0] == 200
    assert cli(gw, "services", "delete", "vers").returncode == 0
    assert http(gw.url + "/v2/models/vers/versions/1/ready")[0] == 404
    # Every pool of the service stopped, the older versions' too: the gateway's processes are
    # the workers of the services it lists, no more.
    deadline = time.monotonic() + 10
    while True:
        listed = {w["pid"] for s in gw.services().values() for w in s.get("workers", [])}
        running = set(gw.worker_pids())
        if running == listed or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert running == listed, (running, listed, gw.services())


SLOW_START = f"{ROOT / 'tests' / 'processors' / 'slow_start.py'}:SlowStart"


def test_create_roll_and_scale_show_their_progress(env: dict[str, Any]) -> None:
    gw, tmp = env["gw"], env["tmp"]
    marker = tmp / "slow"
    marker.touch()  # every worker of this service takes start_s to start

    def spec(start_s: float, workers: int) -> Path:
        path = tmp / "slowroll.yaml"
        doc = {"name": "slowroll", "processor": "python", "public": True, "entry": SLOW_START,
               "workers": workers, "config": {"slow_file": str(marker), "start_s": start_s}}  # fmt: skip
        path.write_text(yaml.safe_dump(doc))
        return path

    def progress(out: subprocess.CompletedProcess[str]) -> list[str]:
        lines = out.stderr.splitlines()
        assert all(re.fullmatch(r"service slowroll: .* \(\d+\.\d s\)", line) for line in lines), out.stderr
        return [line.rpartition(" (")[0].removeprefix("service slowroll: ") for line in lines]

    out = cli(gw, "services", "create", "-f", str(spec(0.8, 1)))
    assert out.returncode == 0, out.stderr
    assert "starting: 0/1 workers ready, 1 starting" in progress(out)
    assert out.stdout.strip() == "service slowroll created (1/1 workers ready; ready)"

    out = cli(gw, "services", "update", "-f", str(spec(0.9, 2)))  # a new config: it rolls
    assert out.returncode == 0, out.stderr
    lines = progress(out)
    assert lines[0] == "rolling out: 0/2 new workers ready, 1 old serving", lines
    assert all(line.startswith("rolling out: ") for line in lines), lines
    assert out.stdout.strip() == "service slowroll updated (2/2 workers ready; ready)"

    out = cli(gw, "services", "scale", "slowroll", "3")
    assert out.returncode == 0, out.stderr
    assert "scaling: 2/3 workers ready, 1 starting" in progress(out)
    assert out.stdout.strip() == "service slowroll scaled to 3 worker(s) (3/3 ready)"

    out = cli(gw, "services", "scale", "--quiet", "slowroll", "2")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.strip() == "service slowroll scaled to 2 worker(s) (2/2 ready)"
    assert cli(gw, "services", "delete", "slowroll").returncode == 0


def _send(url: str, method: str, body: bytes, content_type: str = "application/json") -> tuple[int, Any]:
    return http(url, body, {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": content_type}, method)


_OTHER = json.dumps({"name": "other", "processor": "python", "public": True, "entry": ECHO_ENTRY}).encode()
# Each admin call with a body it cannot use -> what the 400's message says.
BAD_BODIES: list[tuple[str, str, bytes, str]] = [
    ("POST", "/admin/services", b'{"name": "x",', "the body is not valid JSON"),
    ("POST", "/admin/services", b"[1, 2]", "service: expected a mapping, got list"),
    ("PUT", "/admin/services/echo", b"", "the body is empty"),
    ("PUT", "/admin/services/echo", _OTHER, "the description names service 'other', not 'echo'"),
    (
        "POST",
        "/admin/services/echo/scale",
        b'{"workers": "many"}',
        "workers: expected an integer from 1 to 64",
    ),
    ("POST", "/admin/services/echo/scale", b"[3]", 'expected {"workers": N}'),
    ("GET", "/admin/services", b"{}", "GET /admin/services takes no body"),
    ("GET", "/admin/services/echo", b"{}", "GET /admin/services/echo takes no body"),
    ("DELETE", "/admin/services/echo", b'{"force": true}', "DELETE /admin/services/echo takes no body"),
    ("GET", "/admin/status", b"{}", "GET /admin/status takes no body"),
    ("POST", "/admin/reload", b"services: []", "POST /admin/reload takes no body"),
    ("GET", "/admin/openapi.json", b"{}", "GET /admin/openapi.json takes no body"),
    ("GET", "/admin/services/echo/groups", b"{}", "GET /admin/services/echo/groups takes no body"),
    ("DELETE", "/admin/services/echo/groups/g", b"{}", "DELETE /admin/services/echo/groups/g takes no body"),
    ("PUT", "/admin/services/echo/traffic", b"[90, 10]", 'expected {"traffic": {"<version>"'),
    ("POST", "/admin/services/echo/canary", b"[2]", 'canary: expected {"version": N'),
    ("DELETE", "/admin/services/echo/canary", b"{}", "DELETE /admin/services/echo/canary takes no body"),
]


def test_every_admin_call_answers_a_bad_body_with_400_and_what_is_wrong(env: dict[str, Any]) -> None:
    gw = env["gw"]
    base = admin_url(gw)
    for method, path, body, message in BAD_BODIES:
        status, doc = _send(base + path, method, body)
        assert (status, doc["code"]) == (400, "BadRequest"), (method, path, status, doc)
        assert message in doc["message"], (method, path, doc)
    # Every call the API describes is among them, and nothing was changed by any.
    from gateway.fronts.admin.openapi import OPENAPI

    def template(path: str) -> str:
        return re.sub(r"/services/echo", "/services/{name}", path).replace("/groups/g", "/groups/{group}")

    covered = {(m.lower(), template(p)) for m, p, _, _ in BAD_BODIES}
    described = {(m, p) for p, item in OPENAPI["paths"].items() for m in item if m != "parameters"}
    assert described | {("get", "/admin/openapi.json")} == covered
    assert set(gw.services()) >= {"echo"}


def test_a_sklearn_model_is_refused_without_model_directories(env: dict[str, Any]) -> None:
    """This gateway lists no gateway.model_dirs: a sklearn model is a pickle, whose loading runs
    its code, so a service of one, added or put in place of another, is refused with the
    reason, and nothing changes."""
    gw, tmp = env["gw"], env["tmp"]
    model = tiny_pickle(tmp / "models" / "iris.joblib")
    base = admin_url(gw)
    reason = (
        "a sklearn model is a pickle, and loading a pickle runs its code: "
        "list the folders such models may be loaded from in gateway.model_dirs"
    )
    calls = (("POST", "/admin/services", "pickled"), ("PUT", "/admin/services/echo", "echo"))
    for method, path, name in calls:  # added as a new service, and in place of the running echo
        spec = {"name": name, "processor": "sklearn", "public": True, "model": str(model)}
        status, doc = _send(base + path, method, json.dumps(spec).encode())
        assert (status, doc.get("code")) == (400, "BadRequest"), (method, doc)
        assert doc["message"] == f"service ({name}).model: {reason}", method
    services = gw.services()
    assert "pickled" not in services and services["echo"]["processor"] == "python"


def test_create_exits_1_when_the_service_does_not_become_ready(env: dict[str, Any]) -> None:
    gw, tmp = env["gw"], env["tmp"]
    spec = broken_model_spec(tmp, "never", "never")
    out = cli(gw, "services", "create", "-f", str(spec))
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert out.stdout.startswith("service never created (0/1 workers ready; not ready: "), out.stdout
    assert "eas-gateway: service never is not ready: its workers failed to start" in out.stderr
    assert "never.onnx" in out.stderr
    assert cli(gw, "services", "delete", "never").returncode == 0
    out = cli(gw, "services", "create", "--no-wait", "-f", str(spec))  # as before: taken, not waited for
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("service never created (0/1 workers ready; not ready: "), out.stdout
    assert cli(gw, "services", "delete", "never").returncode == 0
