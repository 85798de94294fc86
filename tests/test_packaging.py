"""The package as a user gets it: ``python -m build`` makes an sdist and a wheel, the wheel
installs with its ``gateway`` extra into a fresh virtual environment, and the installed
``eas-gateway serve --model`` serves an ONNX model that the installed SDK then calls.

Nothing here imports the working tree: the build runs on a copy of the sources, and the
gateway, its workers and the client run from the fresh environment with no ``PYTHONPATH``.
One test does it all, in order, because each step needs the one before (about 20 s).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "samples" / "models" / "digits.onnx"
_NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv*", "var", "build", "dist", "*.egg-info", "__pycache__", "*.onnx", ".bench", ".whl"
)

# Run by the installed interpreter: the SDK call a user would make first.
_CLIENT = """
import sys
import numpy as np
import eas_sdk
from eas_sdk import PredictClient, TFRequest
from eas_sdk.errors import NotFoundError

assert "site-packages" in eas_sdk.__file__, eas_sdk.__file__
with PredictClient(sys.argv[1], "digits") as client:
    req = TFRequest("serving_default")
    req.add_feed("input", [2, 64], TFRequest.DT_FLOAT, np.zeros((2, 64), np.float32))
    print("labels", client.predict(req).to_numpy("label").tolist())
    try:
        PredictClient(sys.argv[1], "nope", retry_count=0).predict(req)
    except NotFoundError as exc:
        print("missing", exc.status)
"""


def _env() -> dict[str, str]:
    """The environment without anything that would import the working tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(argv: list[str], cwd: Path, timeout: float) -> str:
    out = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    tail = f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    assert out.returncode == 0, f"{argv[:4]} exited {out.returncode}:\n{tail}"
    return out.stdout


def _build(tmp: Path) -> tuple[Path, Path]:
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCES, symlinks=True)
    dist = tmp / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(src)], tmp, 240)
    (sdist,) = dist.glob("easkit-*.tar.gz")
    (wheel,) = dist.glob("easkit-*-py3-none-any.whl")
    return sdist, wheel


def _check_contents(sdist: Path, wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (meta,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(meta).decode()
        (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "eas-gateway = gateway.cli:main" in zf.read(entry_points).decode()
    for path in (
        "eas_sdk/py.typed",
        "gateway/py.typed",
        "gateway/static/status.html",
        "eas_sdk/_proto/tf_predict_pb2.py",
    ):
        assert path in names, path
    assert not [n for n in names if n.startswith(("tests/", "samples/", "benchmarks/"))]
    requires = [
        line[len("Requires-Dist:") :].strip() for line in metadata.splitlines() if "Requires-Dist:" in line
    ]
    sdk_only = {re.split(r"[<>=!~; ]", r)[0].lower() for r in requires if "extra ==" not in r}
    assert sdk_only == {"protobuf", "numpy", "websockets", "httptools"}, sdk_only
    assert "License-Expression: Apache-2.0" in metadata
    for extra in ("gateway", "images", "redis", "docs"):
        assert f"Provides-Extra: {extra}" in metadata, extra
    with tarfile.open(sdist) as tf:
        members = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "README.md", "eas_sdk/__init__.py", "gateway/cli/__init__.py"} <= members


def _serve(venv: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    model = tmp / "digits.onnx"  # served as the service "digits"
    shutil.copyfile(DIGITS, model)
    port_file = tmp / "port"
    log = (tmp / "gateway.log").open("wb")
    argv = [str(venv / "bin" / "eas-gateway"), "serve", "--model", str(model)]
    argv += ["--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file)]
    proc = subprocess.Popen(
        argv, cwd=tmp, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    log.close()
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise AssertionError("installed gateway did not start:\n" + (tmp / "gateway.log").read_text())
        time.sleep(0.05)
    return proc, "http://" + port_file.read_text().strip()


def _local_labels() -> list[int]:
    """What the model answers for the client's input, run here with ONNX Runtime directly."""
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(DIGITS), providers=["CPUExecutionProvider"])
    (labels,) = session.run(["label"], {"input": np.zeros((2, 64), np.float32)})
    return [int(v) for v in labels]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the workers, should any be left
    except ProcessLookupError:
        pass
    proc.wait(5)


@pytest.mark.package
@pytest.mark.timeout(300)
def test_the_built_wheel_installs_and_serves(tmp_path: Path) -> None:
    sdist, wheel = _build(tmp_path)
    _check_contents(sdist, wheel)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, 120)
    py = str(venv / "bin" / "python")
    constraints = str(ROOT / "requirements" / "constraints.txt")
    _run([py, "-m", "pip", "install", "-q", "-c", constraints, f"{wheel}[gateway]"], tmp_path, 240)

    helped = _run([str(venv / "bin" / "eas-gateway"), "--help"], tmp_path, 60)
    assert "serve" in helped and "EAS-compatible inference gateway" in helped
    code = "import gateway, eas_sdk; print(gateway.__file__, eas_sdk.__file__)"
    where = _run([py, "-c", code], tmp_path, 60)
    assert str(ROOT) not in where and where.count(str(venv)) == 2, where

    proc, url = _serve(venv, tmp_path)
    try:
        out = _run([py, "-c", _CLIENT, url], tmp_path, 60)
        status = _run([str(venv / "bin" / "eas-gateway"), "status", "--url", url], tmp_path, 60)
        with urllib.request.urlopen(url + "/status", timeout=10) as resp:  # the page ships in the wheel
            page = resp.read().decode()
    finally:
        _stop(proc)
    expected = _local_labels()
    assert f"labels {expected}" in out, out
    assert "missing 404" in out, out
    assert "digits" in status and "worker 0:" in status, status
    assert "<title>easkit gateway status</title>" in page
    assert proc.returncode == 0, (tmp_path / "gateway.log").read_text()
