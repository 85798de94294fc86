"""The README's main job runs as documented: gateway + every sample client, then a clean stop."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml

from eas_sdk import PredictClient, StringRequest, TFRequest, TorchRequest
from gateway.config import load_config
from tests.runtime_libraries import require_runtime
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_build_models_builds_every_model_services_yaml_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README "Try it" on a fresh checkout: build_models.py, then services.yaml loads (config
    validation checks that every model file exists)."""
    raw = yaml.safe_load((ROOT / "samples" / "services.yaml").read_text())
    needed = {Path(s["model"]).name for s in raw["services"] if s.get("processor") == "onnx"}
    assert "cluster_serving.onnx" in needed  # the async cs service
    fresh = tmp_path / "checkout"
    shutil.copytree(ROOT / "samples" / "processors", fresh / "samples" / "processors")
    shutil.copy(ROOT / "samples" / "services.yaml", fresh / "samples" / "services.yaml")
    out = fresh / "samples" / "models"
    built = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "build_models.py"), str(out)],
        cwd=ROOT, check=True, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert needed <= {p.name for p in out.glob("*.onnx")}
    # The build that takes seconds says what it is doing before it starts, then that it is done.
    lines = built.stdout.splitlines()
    assert lines[0].startswith("[1/4] digits.onnx: building (fitting a logistic regression"), lines
    assert re.fullmatch(r"\[1/4\] digits\.onnx: built in \d+\.\d s", lines[1]), lines
    monkeypatch.chdir(fresh)  # relative paths resolve here, not in this (already built) tree
    config = load_config("samples/services.yaml")
    models = {Path(s.model).name for s in config.services if s.processor == "onnx" and s.model}
    assert models == needed


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_run_demo_succeeds() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "run_demo.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "all sample clients succeeded" in out
    assert "gateway stopped (exit code 0)" in out
    for client in (
        "string_client.py",
        "tf_client.py",
        "direct_client.py",
        "queue_client.py",
        "kserve_client.py",
        "cluster_serving_client.py",
    ):
        assert f"== {client}" in out


def test_run_sh_hands_its_signals_to_the_demo() -> None:
    """run.sh execs the demo, so a signal to run.sh's process is one to the demo (below)."""
    last = (ROOT / "scripts" / "run.sh").read_text().strip().splitlines()[-1]
    assert last == 'exec .venv/bin/python samples/run_demo.py "$@"', last


def _described(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {p.status()} {' '.join(p.cmdline()[:6])}"
    except psutil.Error:
        return f"{p.pid} gone"


def _descendants_once(pid: int, count: int) -> list[psutil.Process] | None:
    """The process's descendants, once there are ``count`` of them."""
    found = psutil.Process(pid).children(recursive=True)
    return found if len(found) >= count else None


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_serving_demo_stops_the_gateway_and_its_workers(tmp_path: Path, sig: int) -> None:
    """``run.sh --serve`` stopped by ``kill`` or Ctrl-C: the gateway's whole group goes, its
    port is free, and neither the demo's temporary folder nor the workers' sockets stay."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "EASGW_DATA_DIR": str(tmp_path / "data")}
    env["PYTHONUNBUFFERED"] = "1"
    demo = subprocess.Popen(
        [sys.executable, str(ROOT / "samples" / "run_demo.py"), "--serve", "--port", "0"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            seen.append(line)
            if line.startswith("== gateway ready at http://"):
                break
        assert seen and seen[-1].startswith("== gateway ready"), "".join(seen)[-3000:]
        host, port = seen[-1].rsplit("/", 1)[1].strip().rsplit(":", 1)
        # The gateway and every worker process services.yaml asks for (a worker may still be
        # forking); an onnx service with no placement runs in the gateway's threads.
        config = load_config(ROOT / "samples" / "services.yaml")
        expected = 1 + sum(
            s.workers
            for s in config.services
            if s.processor in ("onnx", "python") and s.placement == "process"
        )
        group = wait_until(
            lambda: _descendants_once(demo.pid, expected), 30, f"the gateway and its {expected - 1} workers"
        )
        os.kill(demo.pid, sig)
        try:
            rest, _ = demo.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # What is still running says where the stop hung; the output, how far it got.
            stuck = [_described(p) for p in [psutil.Process(demo.pid), *group]]
            for p in [psutil.Process(demo.pid), *group]:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            rest, _ = demo.communicate(timeout=10)
            pytest.fail(f"not stopped 60 s after {sig!r}; processes: {stuck}\n{''.join(seen)}{rest}"[-6000:])
    finally:
        if demo.poll() is None:  # the test failed before its signal: the demo still stops its gateway
            demo.terminate()
            try:
                demo.wait(60)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait(10)
        if demo.stdout is not None:
            demo.stdout.close()
    assert demo.returncode == 0, "".join(seen) + rest
    assert "== gateway stopped (exit code 0)" in rest, rest
    _, alive = psutil.wait_procs(group, timeout=10)
    assert not alive, alive
    with pytest.raises(ConnectionRefusedError), socket.create_connection((host, int(port)), timeout=5):
        pass
    assert sorted(p.name for p in scratch.iterdir()) == []


def test_build_models_names_the_missing_tools_and_how_to_install_them(tmp_path: Path) -> None:
    """Run where none of the samples' tools are importable (no site-packages): a message, no traceback."""
    out = subprocess.run(
        [sys.executable, "-S", str(ROOT / "samples" / "build_models.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""},
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert "missing here: numpy, onnx, skl2onnx, scikit-learn" in out.stderr, out.stderr
    assert '-py3-none-any.whl[gateway,samples]"' in out.stderr, out.stderr
    assert not list(tmp_path.iterdir())


def _readme_estimators_call() -> tuple[str, str]:
    """The README's call of the samples/estimators.yaml gateway and the output it shows."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(
        r'<!-- skip: next "a call of the gateway samples/estimators\.yaml[^"]*" -->\s*'
        r"```python\n(.*?)```\s*```text\n(.*?)```",
        readme,
        re.S,
    )
    assert found, "README.md: the estimators sample's call"
    return found.group(1), found.group(2)


@pytest.mark.timeout(180)
def test_the_estimators_sample_answers_the_readme_call(tmp_path: Path) -> None:
    """build_models.py's scikit-learn, XGBoost and LightGBM digits, served by
    samples/estimators.yaml, answer the README's call as it shows."""
    import importlib.util

    from tests.e2e.gateway_proc import GatewayProcess

    for module in ("xgboost", "lightgbm"):
        require_runtime(module)
    spec = importlib.util.spec_from_file_location("sample_build_models", ROOT / "samples" / "build_models.py")
    assert spec is not None and spec.loader is not None
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    models = tmp_path / "models"
    built = builder.build_estimators(models)
    assert set(built) == {"digits.joblib", "digits-xgb.json", "digits-lgb.txt"}

    config = yaml.safe_load((ROOT / "samples" / "estimators.yaml").read_text())
    config["gateway"]["model_dirs"] = [str(models)]
    for service in config["services"]:
        service["model"] = str(models / Path(service["model"]).name)
    gw = GatewayProcess.start(config, tmp_path / "gw")
    try:
        names = [s["name"] for s in config["services"]]
        wait_until(lambda: all(gw.services()[n]["ready"] for n in names), 60, "the three services ready")
        code, shown = _readme_estimators_call()
        ran = subprocess.run(
            [sys.executable, "-c", code.replace("127.0.0.1:8090", gw.endpoint)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == shown
    finally:
        assert gw.stop() == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_runtimes_sample_loads_and_each_of_its_services_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """samples/runtimes/services.yaml as it is, beside the models samples/runtimes/build_models.py
    builds (a fresh folder: the file's relative paths resolve against it): it loads, naming the
    EAS guide's services over those models, and served, each answers one call, made as its
    guide demo makes it, with the numbers the library computes."""
    from tests.e2e import runtime_models
    from tests.e2e.gateway_proc import GatewayProcess
    from tests.e2e.runtime_models import TF_SIGNATURE, expected, features, same

    for module in ("torch", "tensorflow", "sklearn_pmml_model"):
        require_runtime(module)
    fresh = tmp_path / "runtimes"
    fresh.mkdir()
    path = Path(shutil.copy(ROOT / "samples" / "runtimes" / "services.yaml", fresh / "services.yaml"))
    built = runtime_models.build(fresh / "models")
    monkeypatch.chdir(tmp_path)  # relative paths resolve against the file, not a built tree
    services = {s.name: s for s in load_config(path).services}
    assert {name: (s.processor, s.model) for name, s in services.items()} == {
        "scorecard_pmml_example": ("pmml", str(built["pmml"].resolve())),
        "mnist_saved_model_example": ("tensorflow", str(built["tensorflow"].resolve())),
        "pytorch_gpu_wl": ("torch", str(built["torch"].resolve())),
    }

    env = {"EASGW_DATA_DIR": str(tmp_path / "data"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    gw = GatewayProcess.start(path, tmp_path / "gw", env=env, timeout=240)

    def client(service: str) -> PredictClient:
        """A client with the token the file gives ``service`` (none for the open one)."""
        return PredictClient(gw.url, service, token=services[service].token or "")

    def all_ready() -> bool:
        return {name for name, s in gw.services().items() if s["ready"]} == set(services)

    try:
        wait_until(all_ready, 240, "the three services ready")
        x = features("pmml", 4)
        want = expected("pmml", built["pmml"], x)
        records = json.dumps([{"fea1": a, "fea2": b} for a, b in x.tolist()])
        with client("scorecard_pmml_example") as c:
            rows = json.loads(c.predict(StringRequest(records)).response_data)
        assert [r["y"] for r in rows] == want["predict"].tolist()
        proba = np.array([[r["probability(0)"], r["probability(1)"]] for r in rows])
        same(proba, want["predict_proba"], "pmml predict_proba")

        x = features("tensorflow")
        tf = TFRequest(TF_SIGNATURE)
        tf.add_feed("images", list(x.shape), TFRequest.DT_FLOAT, x)
        with client("mnist_saved_model_example") as c:
            resp = c.predict(tf)
        for name, array in expected("tensorflow", built["tensorflow"], x).items():
            same(resp.to_numpy(name), array, f"tensorflow {name}")

        x = features("torch", 1)
        torch = TorchRequest()
        torch.add_feed(0, list(x.shape), TorchRequest.DT_FLOAT, x)
        with client("pytorch_gpu_wl") as c:
            resp = c.predict(torch)
        want = expected("torch", built["torch"], x)
        same(resp.to_numpy(0), want["output__0"], "torch output__0")
        same(resp.to_numpy(1), want["output__1"], "torch output__1")
    finally:
        assert gw.stop() == 0
