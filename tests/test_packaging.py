"""The package as a user gets it: ``python -m build`` makes an sdist and a wheel, the wheel
installs with its ``gateway`` and ``samples`` extras into a fresh virtual environment, and
from there the README's path works: the installed ``eas-gateway serve --model`` serves an ONNX
model that the installed SDK then calls, and in the checkout the wheel was built from,
``python samples/build_models.py`` builds the sample models that ``eas-gateway serve --config
samples/services.yaml`` serves, called, looked at with ``eas-gateway status`` and stopped.

Nothing here imports the working tree: the build runs on a copy of the sources, and the
gateway, its workers and the client run from the fresh environment with no ``PYTHONPATH``.
The build and the environment are made once for the module's tests: most of the 45-60 s they
take on a quiet 2-core machine is pip installing the wheel with its extras.
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
from collections.abc import Iterator
from dataclasses import dataclass
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


def _run(argv: list[str], cwd: Path, timeout: float, **env: str) -> str:
    out = subprocess.run(
        argv, cwd=cwd, env={**_env(), **env}, capture_output=True, text=True, timeout=timeout
    )
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
        assert "eas-gateway = gateway.__main__:run" in zf.read(entry_points).decode()
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
    for extra in ("gateway", "samples", "images", "redis", "docs"):
        assert f"Provides-Extra: {extra}" in metadata, extra
    with tarfile.open(sdist) as tf:
        members = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "README.md", "eas_sdk/__init__.py", "gateway/cli/__init__.py"} <= members


def _serve(venv: Path, cwd: Path, *how: str) -> tuple[subprocess.Popen[bytes], str]:
    """``eas-gateway serve *how`` from the fresh environment, on a free port."""
    port_file = cwd / "port"
    log = (cwd / "gateway.log").open("wb")
    argv = [str(venv / "bin" / "eas-gateway"), "serve", *how]
    argv += ["--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file)]
    proc = subprocess.Popen(
        argv, cwd=cwd, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    log.close()
    deadline = time.monotonic() + 90
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise AssertionError("installed gateway did not start:\n" + (cwd / "gateway.log").read_text())
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


@dataclass
class Installed:
    """The wheel built from a copy of the sources, installed in a fresh environment."""

    sdist: Path
    wheel: Path
    checkout: Path  # the copy the wheel was built from, as a user's checkout
    venv: Path

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def eas_gateway(self) -> str:
        return str(self.venv / "bin" / "eas-gateway")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("package")
    sdist, wheel = _build(tmp)
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp, 120)
    constraints = str(ROOT / "requirements" / "constraints.txt")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", constraints]
    _run([*pip, f"{wheel}[gateway,samples]"], tmp, 300)  # as README.md and docs/quickstart.md say
    yield Installed(sdist, wheel, tmp / "src", venv)


@pytest.mark.package
@pytest.mark.timeout(420)
def test_the_built_wheel_installs_and_serves(installed: Installed, tmp_path: Path) -> None:
    _check_contents(installed.sdist, installed.wheel)
    helped = _run([installed.eas_gateway, "--help"], tmp_path, 60)
    assert "serve" in helped and "EAS-compatible inference gateway" in helped
    code = "import gateway, eas_sdk; print(gateway.__file__, eas_sdk.__file__)"
    where = _run([installed.python, "-c", code], tmp_path, 60)
    assert str(ROOT) not in where and where.count(str(installed.venv)) == 2, where

    model = tmp_path / "digits.onnx"  # served as the service "digits"
    shutil.copyfile(DIGITS, model)
    proc, url = _serve(installed.venv, tmp_path, "--model", str(model))
    try:
        out = _run([installed.python, "-c", _CLIENT, url], tmp_path, 60)
        status = _run([installed.eas_gateway, "status", "--url", url], tmp_path, 60)
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


# README.md's call, with the token services.yaml gives digits, and the echo service's curl.
_README_CLIENT = """
import sys
import urllib.request
import numpy as np
from eas_sdk import PredictClient, TFRequest

with PredictClient(sys.argv[1], "digits", token="secret-token") as client:
    req = TFRequest("serving_default")
    req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, np.zeros((1, 64), np.float32))
    print("labels", client.predict(req).to_numpy("label").tolist())
with urllib.request.urlopen(sys.argv[1] + "/api/predict/echo", data=b"hello", timeout=10) as resp:
    print("echo", resp.read().decode())
"""


@pytest.mark.package
@pytest.mark.timeout(420)
def test_the_readme_path_builds_the_samples_serves_them_and_stops(installed: Installed) -> None:
    """In the checkout, with nothing but the fresh environment: build the sample models,
    serve samples/services.yaml, call it, ``eas-gateway status``, stop with SIGTERM."""
    checkout = installed.checkout
    built = _run([installed.python, "samples/build_models.py"], checkout, 240)
    assert "digits.onnx: built in" in built, built
    assert (checkout / "samples" / "models" / "cluster_serving.onnx").is_file()

    proc, url = _serve(installed.venv, checkout, "--config", "samples/services.yaml")
    try:
        out = _run([installed.python, "-c", _README_CLIENT, url], checkout, 60)
        # Sample clients that need the samples extra: scikit-learn's digits, Pillow's images.
        for client in ("tf_client.py", "cluster_serving_client.py"):
            argv = [installed.python, f"samples/clients/{client}", "--endpoint", url]
            out += _run(argv, checkout, 60, TMPDIR=str(checkout))
        status = _run([installed.eas_gateway, "status", "--url", url], checkout, 60)
    finally:
        _stop(proc)
    assert "labels [4]" in out, out  # the answer README.md shows
    assert "echo hello" in out, out
    assert "instance-2 tensor_x2 =" in out, out
    for service in ("digits", "echo", "jobs", "digits-async", "cs"):
        assert service in status, status
    assert proc.returncode == 0, (checkout / "gateway.log").read_text()


@pytest.mark.package
@pytest.mark.timeout(300)
def test_the_sdk_alone_installs_without_server_packages(installed: Installed, tmp_path: Path) -> None:
    """``pip install dist/...whl``: the SDK imports, and ``eas-gateway`` says which extra it
    needs instead of an ImportError's traceback."""
    venv = tmp_path / "sdk-only"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, 120)
    py = str(venv / "bin" / "python")
    constraints = str(ROOT / "requirements" / "constraints.txt")
    _run([py, "-m", "pip", "install", "-q", "-c", constraints, str(installed.wheel)], tmp_path, 240)
    _run([py, "-c", "from eas_sdk import PredictClient, TFRequest"], tmp_path, 60)
    out = subprocess.run(
        [str(venv / "bin" / "eas-gateway"), "serve", "--model", "model.onnx"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert "missing here: aiohttp, onnxruntime, PyYAML" in out.stderr, out.stderr
    assert '.whl[gateway]"' in out.stderr, out.stderr


# The commands the test above walks, as README.md and docs/quickstart.md give them.
_INSTALL_PATH = [
    "python3 -m venv ~/easkit-env && . ~/easkit-env/bin/activate",  # the test's fresh environment
    "pip install build",
    "python -m build",
    'pip install "dist/easkit-0.1.0-py3-none-any.whl[gateway,samples]"',
    "python samples/build_models.py",
    "eas-gateway serve --config samples/services.yaml",
]


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md"])
def test_the_pages_give_the_install_path_the_test_walks(page: str) -> None:
    text = (ROOT / page).read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = [
        [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()] for block in blocks
    ]
    assert _INSTALL_PATH in commands, commands
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version and f"easkit-{version.group(1)}-py3-none-any.whl" in _INSTALL_PATH[3]


def test_the_command_names_the_gateway_extra_where_it_is_missing() -> None:
    """``python -m gateway`` where no site-packages are importable: which extra, how to get it."""
    out = subprocess.run(
        [sys.executable, "-S", "-m", "gateway", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={**_env(), "PYTHONPATH": ""},
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert "missing here: aiohttp, onnxruntime, PyYAML" in out.stderr, out.stderr
