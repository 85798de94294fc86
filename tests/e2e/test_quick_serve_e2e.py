"""``eas-gateway serve --model`` and ``--model-repository --poll`` from the command line,
called by the real eas-prediction client and tritonclient; the repository's new, changed
and removed models are loaded, rolled and unloaded while serving."""

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import ROOT, GatewayProcess
from tests.eas_reference import run_reference
from tests.runtime_libraries import require_runtime

TOKEN = "quick-token-91b2c6d8e4f0a375"
CLIENTS_PYTHON = ROOT / ".venv-clients" / "bin" / "python"
MULTI = ROOT / "samples" / "models" / "multi.onnx"

EAS = r"""
import sys
from eas_prediction import PredictClient, TFRequest
endpoint, service, token = sys.argv[1], sys.argv[2], sys.argv[3]
client = PredictClient(endpoint, service)
if token:
    client.set_token(token)
client.init()
req = TFRequest("serving_default")
req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, [0.5] * 64)
print(list(client.predict(req).get_values("label")))
"""

TRITON = r"""
import json, sys
import numpy as np
import tritonclient.http as http
url, model, token = sys.argv[1], sys.argv[2], sys.argv[3]
headers = {"Authorization": token} if token else None
client = http.InferenceServerClient(url)
inp = http.InferInput("input", [1, 64], "FP32")
inp.set_data_from_numpy(np.full((1, 64), 0.5, dtype=np.float32), binary_data=False)
out = http.InferRequestedOutput("label", binary_data=False)
result = client.infer(model, [inp], outputs=[out], headers=headers)
ready = client.is_model_ready(model, headers=headers)
print(json.dumps({"ready": ready, "label": result.as_numpy("label").tolist()}))
"""


def _triton(gw: GatewayProcess, model: str, token: str = "") -> dict[str, Any]:
    if not CLIENTS_PYTHON.exists():
        if os.environ.get("CI"):
            raise RuntimeError(f"{CLIENTS_PYTHON} missing; run scripts/setup.sh")
        pytest.skip(".venv-clients is not built")
    proc = subprocess.run(
        [str(CLIENTS_PYTHON), "-c", TRITON, gw.endpoint, model, token],
        capture_output=True, text=True, timeout=120, env={"PATH": os.environ.get("PATH", "")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def _eas_label(gw: GatewayProcess, service: str, token: str = "") -> list[int]:
    out = run_reference(EAS, gw.endpoint, service, token, timeout=60).stdout.decode()
    return list(json.loads(out))


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def _status(gw: GatewayProcess, path: str) -> int:
    try:
        with urllib.request.urlopen(gw.url + path, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code


def _wide_model(path: Path) -> Path:
    """A model whose input (1 x 3 x 16 x 16) is too long for a call hint to write out."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["image"], ["same"])],
        "wide",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("same", TensorProto.FLOAT, [1, 3, 16, 16])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _hint(out: str, service: str, kind: str) -> str:
    """The command the gateway printed for ``service`` after ``kind``'s label."""
    block = out.split(f"service {service}: ", 1)[1]
    return next(line for line in block.splitlines() if line.startswith(f"  {kind}")).split(": ", 1)[1]


def test_serve_model_prints_how_to_call_it(tmp_path: Path, digits_model: Path) -> None:
    wide = _wide_model(tmp_path / "wide.onnx")
    args = (
        "--model",
        str(digits_model),
        "--name",
        "digits",
        "--model",
        str(wide),
        "--workers",
        "2",
        "--token",
        TOKEN,
    )
    gw = GatewayProcess.start({}, tmp_path / "gw", serve_args=args, env={"EASGW_DATA_DIR": str(tmp_path)})
    try:
        out = gw.output()
        assert f"service digits: {digits_model}" in out
        python_line = f"client = PredictClient('127.0.0.1:{gw.port}', 'digits'); client.set_token("
        assert python_line in out
        assert f'curl -H "Authorization: $EAS_TOKEN" {gw.url}/v2/models/digits/infer -d ' in out
        assert '"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0, 0.0, ' in out
        assert TOKEN not in out  # the token is never printed
        # Every hint runs as printed, pasted into a shell (curl) or Python, with the token set.
        env = {**os.environ, "EAS_TOKEN": TOKEN}
        for service, outputs in (("digits", {"label", "probabilities"}), ("wide", {"same"})):
            curl = subprocess.run(
                ["bash", "-c", _hint(out, service, "curl")],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            answer = json.loads(curl.stdout)
            assert {o["name"] for o in answer["outputs"]} >= outputs, (curl.stdout, curl.stderr)
        python = _hint(out, "digits", "python")
        ran = subprocess.run(
            [sys.executable, "-c", python], env=env, capture_output=True, text=True, timeout=30
        )
        assert ran.returncode == 0, ran.stderr
        assert "python3 -c " in _hint(out, "wide", "curl")  # 768 zeros: made by Python, not written out
        gw.wait_workers_ready("digits", 2)
        label = _eas_label(gw, "digits", TOKEN)
        assert _triton(gw, "digits", TOKEN) == {"ready": True, "label": label}
        os.kill(gw.pid, signal.SIGHUP)  # nothing to reload: said, and the gateway serves on
        _until(lambda: "SIGHUP received: nothing to reload" in gw.output(), 10, "SIGHUP logged")
        assert gw.proc.poll() is None and _eas_label(gw, "digits", TOKEN) == label
    finally:
        assert gw.stop() == 0


def test_model_repository_follows_the_folder(tmp_path: Path, digits_model: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "digits" / "1").mkdir(parents=True)
    shutil.copy(digits_model, repo / "digits" / "1" / "model.onnx")
    (repo / "digits" / "config.pbtxt").write_text('name: "digits"\n')  # Triton's, left alone
    args = ("--model-repository", str(repo), "--poll", "0.3")
    gw = GatewayProcess.start({}, tmp_path / "gw", serve_args=args, env={"EASGW_DATA_DIR": str(tmp_path)})
    try:
        assert set(gw.services()) == {"digits"}
        label = _eas_label(gw, "digits")

        # A new version folder: rolled to it; a new model file: loaded.
        (repo / "digits" / "2").mkdir()
        shutil.copy(digits_model, repo / "digits" / "2" / "model.onnx")
        shutil.copy(MULTI, repo / "multi.onnx")
        _until(lambda: gw.services().get("multi", {}).get("ready") is True, 30, "multi loaded")
        _until(
            lambda: _status(gw, "/v2/models/digits/versions/2/ready") == 200, 30, "digits rolled to version 2"
        )
        assert _triton(gw, "digits") == {"ready": True, "label": label}
        assert _status(gw, "/v2/models/multi/ready") == 200
        # Reported as the version its folder names, as Triton does.
        with urllib.request.urlopen(gw.url + "/v2/models/digits", timeout=10) as r:
            assert json.loads(r.read())["versions"] == ["2"]
        assert _status(gw, "/v2/models/digits/versions/2/ready") == 200

        # Removed: unloaded.
        (repo / "multi.onnx").unlink()
        _until(lambda: "multi" not in gw.services(), 30, "multi unloaded")
        assert _status(gw, "/v2/models/multi/ready") == 404
        # Logged once the scan is applied (the unloaded model's workers have stopped).
        _until(lambda: "removed multi" in gw.output(), 30, "the unload logged")
        assert re.search(r"model repository \S+: added multi", gw.output())
    finally:
        assert gw.stop() == 0


def test_serve_model_that_cannot_load_exits_1_with_the_load_error(tmp_path: Path) -> None:
    """Not ready is never announced: no listening line, no call hints, the load error and exit 1."""
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--model", str(junk), "--port", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "EASGW_DATA_DIR": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""  # neither "gateway listening on" nor how to call it
    failed = [line for line in proc.stderr.splitlines() if "start-up failed" in line]
    assert len(failed) == 1, proc.stderr
    # An onnx model runs in the gateway's threads by default (placement: auto).
    assert "service junk cannot serve: its model failed to load: " in failed[0]
    assert "junk.onnx" in failed[0] and "ready" not in proc.stderr.split("start-up failed", 1)[1], proc.stderr


def _v2(gw: GatewayProcess, model: str, x: Any) -> dict[str, Any]:
    import numpy as np

    x = np.asarray(x)
    datatype = {"float32": "FP32", "float64": "FP64"}[x.dtype.name]
    body = {
        "inputs": [
            {"name": "input", "shape": list(x.shape), "datatype": datatype, "data": x.ravel().tolist()}
        ]
    }
    req = urllib.request.Request(
        f"{gw.url}/v2/models/{model}/infer", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in json.loads(r.read())["outputs"]}


@pytest.mark.timeout(180)
def test_model_repository_serves_every_runtime(tmp_path: Path, digits_model: Path) -> None:
    """scikit-learn, XGBoost, LightGBM and PMML files beside an ONNX model, in Triton's layout,
    each served by its runtime with the numbers the library computes; the pickle loads because
    the repository is the operator's folder. A folder it cannot tell stops the start, named."""
    from tests.e2e import estimator_models, runtime_models

    require_runtime("sklearn_pmml_model")  # the card service's, and its expected numbers
    built = estimator_models.build(tmp_path / "built")
    repo = tmp_path / "repo"
    # (.ubj, .pkl and the other suffixes: tests/gateway/test_model_repository.py)
    layout = {"iris-sk": ("sklearn", "model.joblib"), "iris-xgb": ("xgboost", "model.json"),
              "iris-lgb": ("lightgbm", "model.txt")}  # fmt: skip
    for service, (model, file) in layout.items():
        (repo / service / "1").mkdir(parents=True)
        shutil.copy(built[model], repo / service / "1" / file)
    (repo / "iris-lgb" / "1" / "labels.txt").write_text("setosa\nversicolor\nvirginica\n")  # left alone
    (repo / "card" / "2").mkdir(parents=True)
    runtime_models.sample_builder().build_pmml(repo / "card" / "2" / "model.pmml")
    shutil.copy(digits_model, repo / "digits.onnx")
    gw = GatewayProcess.start(
        {},
        tmp_path / "gw",
        serve_args=("--model-repository", str(repo)),
        env={"EASGW_DATA_DIR": str(tmp_path)},
    )
    try:
        assert set(gw.services()) == {*layout, "card", "digits"}
        for service, (model, file) in layout.items():
            x = estimator_models.features(model)
            want = estimator_models.expected(model, repo / service / "1" / file, x)
            got = _v2(gw, service, x)
            assert set(got) == set(want), service
            for name, array in want.items():
                runtime_models.same(got[name], array, f"{service}.{name}")
        x = runtime_models.features("pmml", rows=4)
        want = runtime_models.expected("pmml", repo / "card" / "2" / "model.pmml", x)
        got = _v2(gw, "card", x)
        for name, array in want.items():
            runtime_models.same(got[name], array, f"card.{name}")
        assert _status(gw, "/v2/models/digits/ready") == 200
    finally:
        assert gw.stop() == 0

    (repo / "odd" / "1").mkdir(parents=True)
    (repo / "odd" / "1" / "model.bin").write_bytes(b"?")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--model-repository", str(repo), "--port", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "EASGW_DATA_DIR": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode != 0
    assert f"--model-repository {repo}: odd/1/model.bin: not a model file the gateway can tell" in proc.stderr
    assert ".joblib, .pkl" in proc.stderr and ".pmml" in proc.stderr, proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_model_repository_serves_torchscript_and_savedmodels(tmp_path: Path) -> None:
    """A TorchScript file and a SavedModel (Triton's model.savedmodel/; TensorFlow Serving's
    layout is read the same way, tests/gateway/test_model_repository.py) in one repository,
    each answering as the library computes."""
    require_runtime("torch")
    require_runtime("tensorflow")
    import numpy as np

    from tests.e2e import runtime_models

    builder = runtime_models.sample_builder()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    repo = tmp_path / "repo"
    (repo / "net" / "1").mkdir(parents=True)
    (repo / "mnist" / "1").mkdir(parents=True)
    builder.build_torch(repo / "net" / "1" / "model.pt")
    builder.build_savedmodel(repo / "mnist" / "1" / "model.savedmodel")
    gw = GatewayProcess.start(
        {},
        tmp_path / "gw",
        serve_args=("--model-repository", str(repo)),
        env={"EASGW_DATA_DIR": str(tmp_path)},
    )
    # What the start-up printed (how to call each service), before any call's access line.
    banner = gw.output()
    try:
        assert {n: s["processor"] for n, s in gw.services().items()} == {
            "net": "torch", "mnist": "tensorflow"
        }  # fmt: skip
        for service in ("mnist",):
            x = runtime_models.features("tensorflow")
            want = runtime_models.expected("tensorflow", repo / "mnist" / "1" / "model.savedmodel", x)
            body = {"inputs": [{"name": "images", "shape": list(x.shape), "datatype": "FP32",
                                "data": x.ravel().tolist()}]}  # fmt: skip
            req = urllib.request.Request(
                f"{gw.url}/v2/models/{service}/infer", data=json.dumps(body).encode()
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                got = {
                    o["name"]: np.asarray(o["data"]).reshape(o["shape"])
                    for o in json.loads(r.read())["outputs"]
                }
            for name, array in want.items():
                runtime_models.same(got[name], array, f"{service}.{name}")
        x = runtime_models.features("torch", rows=1)
        want = runtime_models.expected("torch", repo / "net" / "1" / "model.pt", x)
        body = {
            "inputs": [
                {"name": "image", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
            ]
        }
        req = urllib.request.Request(f"{gw.url}/v2/models/net/infer", data=json.dumps(body).encode())
        with urllib.request.urlopen(req, timeout=60) as r:
            got = {
                o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in json.loads(r.read())["outputs"]
            }
        for name, array in want.items():
            runtime_models.same(got[name], array, f"net.{name}")
        # TorchScript keeps no input types: no zero tensor is offered to send, the metadata is.
        assert "v2/models/net/infer" not in banner and "v2/models/net\n" in banner
    finally:
        assert gw.stop() == 0
