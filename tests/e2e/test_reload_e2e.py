"""SIGHUP reloads the config file under load from the real eas-prediction client: a service
added, one changed (rolled), one removed, no failed call; Triton's model control from the
real tritonclient; ``eas-gateway status``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.gateway_proc import ECHO_ENTRY, ROOT, GatewayProcess
from tests.e2e.reference_load import ReferenceLoad
from tests.redis_server import free_port
from tests.waiting import wait_until

ADMIN_TOKEN = "admin-token-e0d4b7a9c3f21865"
CLIENTS_PYTHON = ROOT / ".venv-clients" / "bin" / "python"

TRITON = r"""
import json, sys
import numpy as np
import tritonclient.http as http
from tritonclient.utils import InferenceServerException
url, token = sys.argv[1], sys.argv[2]
client = http.InferenceServerClient(url)
admin = {"Authorization": "Bearer " + token}
out = {}
try:
    client.unload_model("digits")
except InferenceServerException as exc:
    out["without_token"] = int(exc.status())
client.unload_model("digits", headers=admin)
out["after_unload"] = client.is_model_ready("digits")
client.load_model("digits", headers=admin)
out["after_load"] = client.is_model_ready("digits")
inp = http.InferInput("input", [1, 64], "FP32")
inp.set_data_from_numpy(np.full((1, 64), 0.5, dtype=np.float32), binary_data=False)
label = http.InferRequestedOutput("label", binary_data=False)
out["label"] = client.infer("digits", [inp], outputs=[label]).as_numpy("label").tolist()
print(json.dumps(out))
"""


TRITON_GRPC = r"""
import json, sys
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
url, token = sys.argv[1], sys.argv[2]
client = grpcclient.InferenceServerClient(url)
admin = {"authorization": "Bearer " + token}
out = {}
try:
    client.unload_model("digits")
except InferenceServerException as exc:
    out["without_token"] = exc.status()
client.unload_model("digits", headers=admin)
out["after_unload"] = client.is_model_ready("digits")
client.load_model("digits", headers=admin)
out["after_load"] = client.is_model_ready("digits")
inp = grpcclient.InferInput("input", [1, 64], "FP32")
inp.set_data_from_numpy(np.full((1, 64), 0.5, dtype=np.float32))
out["label"] = client.infer("digits", [inp]).as_numpy("label").tolist()
print(json.dumps(out))
"""


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


GRPC_PORT = free_port()  # one port for the module: a reloaded file keeps the listener's


def _config(tmp: Path, services: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "admin": {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN},
        "gateway": {"shutdown_timeout_s": 10, "data_dir": str(tmp / "data"), "grpc_port": GRPC_PORT},
        "services": services,
    }


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("reload")
    shutil.copy(digits_model, tmp / "digits-v1.onnx")
    shutil.copy(digits_model, tmp / "digits-v2.onnx")
    services = [
        {
            "name": "digits",
            "processor": "onnx",
            "placement": "process",
            "public": True,
            "model": str(tmp / "digits-v1.onnx"),
        },
        {"name": "echo", "processor": "python", "public": True, "entry": ECHO_ENTRY},
    ]
    gw = GatewayProcess.start(_config(tmp, services), tmp / "gw")
    try:
        yield {"gw": gw, "tmp": tmp}
    finally:
        gw.kill()


def test_sighup_applies_the_changed_file_under_load(env: dict[str, Any]) -> None:
    gw, tmp = env["gw"], env["tmp"]
    before = {w["pid"] for w in gw.services()["digits"]["workers"]}
    changed = [
        {
            "name": "digits",
            "processor": "onnx",
            "placement": "process",
            "public": True,
            "model": str(tmp / "digits-v2.onnx"),
            "workers": 2,
        },
        {"name": "echo2", "processor": "python", "public": True, "entry": ECHO_ENTRY},
    ]
    load = ReferenceLoad.start(gw.endpoint, "digits", tmp)
    try:
        (gw.workdir / "services.yaml").write_text(yaml.safe_dump(_config(tmp, changed)))
        os.kill(gw.pid, signal.SIGHUP)
        deadline = time.monotonic() + 60
        while "config reloaded" not in gw.output() and time.monotonic() < deadline:
            time.sleep(0.1)
        load.wait_calls(60)  # calls on the reloaded config too
    finally:
        result = load.finish()
    out = gw.output()
    assert "config reloaded in " in out and "added echo2, changed digits, removed echo" in out, out[-3000:]
    assert result["failed"] == [], result["failed"][:5]
    assert result["ok"] > 100
    services = gw.services()
    assert set(services) == {"digits", "echo2"}
    after = [w for w in services["digits"]["workers"] if w["state"] == "ready"]
    assert len(after) == 2 and not before & {w["pid"] for w in after}
    assert _post(gw.url + "/api/predict/echo", b"x")[0] == 404
    assert _post(gw.url + "/api/predict/echo2", b"new") == (200, b"new")
    assert gw.proc.poll() is None  # SIGHUP no longer ends the gateway


def _status(*argv: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "status", *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, "EAS_ADMIN_URL": ""},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_status_is_one_table_from_the_admin_api_or_the_main_port(env: dict[str, Any]) -> None:
    gw = env["gw"]
    admin = re.findall(r"admin API listening on (http://\S+)", gw.output())[-1]
    tables = [_status("--admin", admin, "--token", ADMIN_TOKEN), _status("--url", gw.url)]
    for lines in tables:
        assert re.fullmatch(r"gateway \S+, up \d+ s; rates over the last \d+ s", lines[0]), lines
        assert lines[2].split() == ["service", "kind", "ready", "req/s", "p50", "ms", "p99", "ms", "5xx", "%",
                                    "requests", "restarts"]  # fmt: skip
    rows = [
        {line.split()[0]: line.split()[1:3] for line in lines[3:] if not line.startswith(" ")}
        for lines in tables
    ]
    assert rows[0] == rows[1] and rows[0]["digits"] == ["onnx", "yes"], rows
    workers = [sum(line.startswith("    worker ") for line in lines) for lines in tables]
    assert workers[0] == workers[1] >= 2, tables


def test_reload_of_a_broken_file_is_400_with_the_message_sighup_logs(env: dict[str, Any]) -> None:
    gw = env["gw"]
    admin = re.findall(r"admin API listening on (http://\S+)", gw.output())[-1]
    path = gw.workdir / "services.yaml"
    good = path.read_text()
    broken = yaml.safe_load(good)
    broken["services"][0]["wokers"] = 2
    path.write_text(yaml.safe_dump(broken))
    try:
        req = urllib.request.Request(
            admin + "/admin/reload", method="POST", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        with pytest.raises(urllib.error.HTTPError) as info, urllib.request.urlopen(req, timeout=30):
            pass
        with info.value as answer:
            assert answer.code == 400
            message = json.loads(answer.read())["message"]
        assert message.startswith("reload refused, the running services stay: services[0] "), message
        assert "unknown key 'wokers' (line " in message and "did you mean 'workers'?" in message, message
        os.kill(gw.pid, signal.SIGHUP)
        wait_until(lambda: message in gw.output(), 10, "the same message logged on SIGHUP")
    finally:
        path.write_text(good)


def test_triton_model_control(env: dict[str, Any]) -> None:
    if not CLIENTS_PYTHON.exists():
        if os.environ.get("CI"):
            raise RuntimeError(f"{CLIENTS_PYTHON} missing; run scripts/setup.sh")
        pytest.skip(".venv-clients is not built")
    gw = env["gw"]
    proc = subprocess.run(
        [str(CLIENTS_PYTHON), "-c", TRITON, gw.endpoint, ADMIN_TOKEN],
        capture_output=True, text=True, timeout=120, env={"PATH": os.environ.get("PATH", "")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result == {
        "without_token": 401,
        "after_unload": False,
        "after_load": True,
        "label": result["label"],
    }
    assert len(result["label"]) == 1


def test_triton_model_control_over_grpc(env: dict[str, Any]) -> None:
    """The same model control through tritonclient.grpc: the admin token in the call's
    metadata, the service manager behind it."""
    if not CLIENTS_PYTHON.exists():
        if os.environ.get("CI"):
            raise RuntimeError(f"{CLIENTS_PYTHON} missing; run scripts/setup.sh")
        pytest.skip(".venv-clients is not built")
    assert env["gw"].proc.poll() is None  # the module's gateway, on GRPC_PORT
    proc = subprocess.run(
        [str(CLIENTS_PYTHON), "-c", TRITON_GRPC, f"127.0.0.1:{GRPC_PORT}", ADMIN_TOKEN],
        capture_output=True, text=True, timeout=120, env={"PATH": os.environ.get("PATH", "")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["without_token"] == "StatusCode.UNAUTHENTICATED"
    assert (result["after_unload"], result["after_load"]) == (False, True)
    assert len(result["label"]) == 1
