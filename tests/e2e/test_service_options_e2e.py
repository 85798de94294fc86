"""Per-service options against the real gateway: python processors that read request headers
and set the Content-Type, a worker environment that holds only what a service passes through,
ONNX Runtime providers chosen per service (and a GPU run where there is one), and model
files kept inside the configured model directories."""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
import yaml

from gateway.cli import main
from tests.e2e.estimator_models import tiny_pickle
from tests.e2e.gateway_proc import GatewayProcess

TOKEN = "options-token-4d8a2f6c1e9b7053"
ADMIN_TOKEN = "options-admin-5e3c9a1f7b2d4068"

INSPECT = """
import json, os

class Headers:
    def process(self, data, headers):
        return json.dumps(headers, sort_keys=True), 201, "application/json; charset=utf-8"

class Environment:
    def process(self, data):
        names = ("PASSED", "SET_HERE", "OTHER_SECRET", "PATH")
        return json.dumps({n: os.environ.get(n) for n in names})
"""


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers.get("Content-Type", ""), exc.read()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("options")
    models = tmp / "models"
    models.mkdir()
    shutil.copy(digits_model, models / "digits.onnx")
    (models / "inspect.py").write_text(INSPECT, encoding="utf-8")
    config = {
        "admin": {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN},
        "gateway": {"model_dirs": [str(models)], "restart_backoff_max_s": 2},
        "services": [
            {
                "name": "headers",
                "processor": "python",
                "entry": f"{models / 'inspect.py'}:Headers",
                "token": TOKEN,
            },
            {
                "name": "environment",
                "processor": "python",
                "public": True,
                "entry": f"{models / 'inspect.py'}:Environment",
                "env": {"PASSED": None, "SET_HERE": "set in the config"},
            },
            {
                "name": "fallback",
                "processor": "onnx",
                "public": True,
                "model": str(models / "digits.onnx"),
                "providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                "inter_op_threads": 2,
            },
        ],
    }
    secrets = {"PASSED": "passed through", "OTHER_SECRET": "another service's token"}
    gw = GatewayProcess.start(config, tmp / "gw", env=secrets)
    try:
        yield {"gw": gw, "tmp": tmp, "models": models}
    finally:
        gw.kill()


def test_a_processor_reads_headers_and_sets_the_content_type(env: dict[str, Any]) -> None:
    gw = env["gw"]
    status, ctype, body = _post(
        gw.url + "/api/predict/headers", b"x", {"Authorization": TOKEN, "X-Trace": "abc"}
    )
    assert (status, ctype) == (201, "application/json; charset=utf-8")
    seen = {k.lower(): v for k, v in json.loads(body).items()}
    assert seen["x-trace"] == "abc"
    assert "authorization" not in seen  # credentials never reach a processor


def test_the_worker_environment_holds_only_what_is_passed(env: dict[str, Any]) -> None:
    status, _, body = _post(env["gw"].url + "/api/predict/environment", b"x")
    assert status == 200
    assert json.loads(body) == {
        "PASSED": "passed through",
        "SET_HERE": "set in the config",
        "OTHER_SECRET": None,
        "PATH": os.environ["PATH"],
    }


def test_providers_per_service_fall_back_and_say_so(env: dict[str, Any]) -> None:
    gw = env["gw"]
    gw.wait_workers_ready("fallback", 1)
    worker = gw.services()["fallback"]["workers"][0]
    out = gw.output()
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert worker["providers"][0] == "CUDAExecutionProvider"
    else:
        assert worker["providers"] == ["CPUExecutionProvider"]
        assert "service fallback: CUDAExecutionProvider not available in this ONNX Runtime build" in out
    assert re.search(
        r"service fallback: ONNX Runtime runs on \S+.* \(intra-op 1, inter-op 2 thread\(s\)\)", out
    )


@pytest.mark.parametrize("processor", ["onnx", "sklearn"])
def test_a_model_outside_the_model_directories_is_refused(env: dict[str, Any], processor: str) -> None:
    """A service added at run time through the admin API loads only from gateway.model_dirs,
    neither ``..`` nor a link leading out of them; a sklearn model (a pickle) no more than an
    ONNX file."""
    gw, tmp, models = env["gw"], env["tmp"], env["models"]
    suffix = {"onnx": ".onnx", "sklearn": ".joblib"}[processor]
    outside = tmp / f"outside{suffix}"
    if processor == "onnx":
        shutil.copy(models / "digits.onnx", outside)
    else:
        tiny_pickle(outside)
    (models / f"link{suffix}").symlink_to(outside)
    admin = re.findall(r"admin API listening on (http://\S+)", gw.output())[-1]
    for path in (str(models / ".." / outside.name), str(models / f"link{suffix}")):
        spec = json.dumps({"name": "escape", "processor": processor, "public": True, "model": path}).encode()
        status, _, body = _post(
            admin + "/admin/services",
            spec,
            {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
        )
        assert status == 400, body
        message = json.loads(body)["message"]
        assert message == (
            f"service (escape).model: {Path(path).name} is outside the model directories "
            f"(gateway.model_dirs: {models.resolve()})"
        )
    assert "escape" not in gw.services()


def test_validate_refuses_an_escaping_path(env: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    tmp, models = env["tmp"], env["models"]
    config = {
        "gateway": {"model_dirs": [str(models)]},
        "services": [
            {
                "name": "escape",
                "processor": "onnx",
                "public": True,
                "model": str(models / ".." / "outside.onnx"),
            }
        ],
    }
    path = tmp / "escape.yaml"
    path.write_text(yaml.safe_dump(config))
    shutil.copy(models / "digits.onnx", tmp / "outside.onnx")
    assert main(["validate", str(path)]) == 1
    assert (
        "services[0] (escape).model: outside.onnx is outside the model directories" in capsys.readouterr().err
    )


def test_only_unavailable_providers_is_a_clear_failure(tmp_path: Path, digits_model: Path) -> None:
    available = ort.get_available_providers()
    wanted = (
        "TensorrtExecutionProvider"
        if "TensorrtExecutionProvider" not in available
        else "ROCMExecutionProvider"
    )
    config = {
        "gateway": {"worker_start_timeout_s": 10},
        "services": [
            {
                "name": "nowhere",
                "processor": "onnx",
                "public": True,
                "model": str(digits_model),
                "providers": [wanted],
            }
        ],
    }
    gw = GatewayProcess.start(config, tmp_path / "gw")
    try:
        status, body = gw.get_json("/readyz?service=nowhere")
        assert status == 503
        assert f"none of the execution providers {wanted} is available in this ONNX Runtime" in body["reason"]
    finally:
        gw.kill()


@pytest.mark.gpu
def test_cuda_provider_runs_the_model_on_the_gpu(tmp_path: Path, digits_model: Path) -> None:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has no CUDA execution provider")
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no NVIDIA GPU on this machine")
    config = {
        "services": [
            {
                "name": "gpu",
                "processor": "onnx",
                "public": True,
                "model": str(digits_model),
                "providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
            }
        ]
    }
    gw = GatewayProcess.start(config, tmp_path / "gw")
    try:
        worker = gw.wait_workers_ready("gpu", 1)[0]
        assert worker["providers"][0] == "CUDAExecutionProvider", worker
        doc = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}
        status, _, body = _post(gw.url + "/v2/models/gpu/infer", json.dumps(doc).encode())
        assert status == 200 and json.loads(body)["outputs"]
    finally:
        gw.kill()
