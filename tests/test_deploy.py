"""The container image and Kubernetes manifests (``Dockerfile``, ``deploy/kubernetes/``).

Nothing here runs Docker or a cluster: the manifests are validated against the Kubernetes
schemas offline (kubernetes-validate, in .venv-deploy), the Dockerfile is checked for what
it promises (multi-stage, non-root, a pinned base, a health check), and the exact command
lines of the containers run here, with only file paths, the listen address and the port
substituted: the gateway's (probed on the paths the Deployment's probes use, and by the
image's own HEALTHCHECK command) and Redis' (with the persistence the queue requires).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
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
from eas_sdk.queue import QueueClient
from gateway.config import parse_config
from tests.redis_server import RedisServer, free_port
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
VALIDATE = Path(os.environ.get("K8S_VALIDATE", ROOT / ".venv-deploy" / "bin" / "kubernetes-validate"))


def _docs() -> list[dict[str, Any]]:
    return [d for p in MANIFESTS for d in yaml.safe_load_all(p.read_text()) if d]


def _one(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, argument) pairs, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _validator() -> str:
    if not VALIDATE.exists():
        if os.environ.get("CI"):
            raise RuntimeError(f"{VALIDATE} missing: run scripts/setup.sh")
        pytest.skip("kubernetes-validate environment (.venv-deploy) is not built")
    return str(VALIDATE)


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_every_manifest_validates_against_the_kubernetes_schemas(version: str, tmp_path: Path) -> None:
    kinds = {d["kind"] for d in _docs()}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "StatefulSet", "HorizontalPodAutoscaler"} <= kinds
    argv = [_validator(), "--strict", "--quiet", "-k", version]
    files = [str(p) for p in MANIFESTS]
    ok = subprocess.run([*argv, *files], capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The validator is not vacuous: a misspelt field fails.
    bad = tmp_path / "bad.yaml"
    text = (ROOT / "deploy/kubernetes/gateway.yaml").read_text()
    bad.write_text(text.replace("replicas: 2", "replicaz: 2"))
    refused = subprocess.run([*argv, str(bad)], capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode != 0


def test_dockerfile_is_multi_stage_non_root_pinned_with_a_health_check() -> None:
    instr = _dockerfile()
    args = dict(a.split("=", 1) for w, a in instr if w == "ARG" and "=" in a)
    stages = [a for w, a in instr if w == "FROM"]
    assert len(stages) >= 2 and stages[0].endswith(" AS build")
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base), base  # an exact release, not "latest"
    users = [a for w, a in instr if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert any(w == "HEALTHCHECK" for w, _ in instr)
    assert any(w == "COPY" and a.startswith("--from=build ") for w, a in instr)


def _wait_http(url: str, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:  # listening, and answering with an error status
            return int(exc.code)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _secret_values() -> dict[str, str]:
    """Every key of the Secret, with a test value (tokens from the Secret, never the ConfigMap)."""
    return {
        k: f"deploy-test-{k.lower().replace('_', '-')}-0123456789"
        for k in _one("Secret", "easkit-tokens")["stringData"]
    }


@contextlib.contextmanager
def _gateway_from_manifests(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The gateway container's exact command line, run here: the image's ENTRYPOINT and CMD
    (which the Deployment runs), the ConfigMap's services file, the Secret's variables; only
    file paths, the listen address, the port and the Redis address are substituted."""
    instr = _dockerfile()
    entry = json.loads(next(a for w, a in instr if w == "ENTRYPOINT"))
    cmd = json.loads(next(a for w, a in instr if w == "CMD"))
    deployment = _one("Deployment", "easkit-gateway")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == cmd  # the Deployment runs the image's own command
    services = _one("ConfigMap", "easkit-services")["data"]["services.yaml"]
    raw = yaml.safe_load(services)
    raw["queue"]["backend"] = redis_server.url(5)  # the in-cluster Redis Service, here
    config = tmp_path / "services.yaml"
    config.write_text(yaml.safe_dump(raw))
    port = free_port()
    subst = {"/etc/easkit/services.yaml": str(config), "0.0.0.0": "127.0.0.1", "8080": str(port)}
    argv = [str(ROOT / ".venv" / "bin" / entry[0]), *entry[1:], *(subst.get(a, a) for a in cmd)]
    secrets = _secret_values()
    env = {
        **os.environ,
        "POD_IP": "127.0.0.1",
        **secrets,
        "EASGW_DATA_DIR": str(tmp_path / "data"),  # the image's ENV, here
        "PYTHONPATH": str(ROOT),
    }
    for var in ("POD_IP", *secrets):
        monkeypatch.setenv(var, env[var])
    parse_config(yaml.safe_load(config.read_text()))  # valid as written (${VAR} from the environment)
    with redis_server.client(5) as c:
        c.flushdb()
    log = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, cwd=tmp_path, start_new_session=True)
    log.close()
    try:
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            path = container[probe]["httpGet"]["path"]
            status = _wait_http(f"http://127.0.0.1:{port}{path}")
            # /readyz waits for every service: one served only by remote workers has none yet.
            assert status == 200 or (probe == "readinessProbe" and status == 503)
        yield port, {"container": container, "instr": instr, "secrets": secrets}
    finally:
        proc.send_signal(signal.SIGTERM)
        # The first is being handled (the gateway says it drains) before the second, which
        # skips the configured drain delay.
        deadline = time.monotonic() + 10  # then on regardless: the clean-up must go on
        while b"draining for" not in (tmp_path / "gateway.log").read_bytes() and proc.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, (tmp_path / "gateway.log").read_text()[-3000:]


def test_the_gateway_container_command_runs_here(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _gateway_from_manifests(redis_server, tmp_path, monkeypatch) as (port, ctx):
        instr = ctx["instr"]
        health = json.loads(next(a for w, a in instr if w == "HEALTHCHECK").split(" CMD ", 1)[1])  # exec form
        check = [sys.executable if health[0] == "python" else health[0], *health[1:]]
        check = [a.replace(":8080/", f":{port}/") for a in check]
        assert subprocess.run(check, timeout=10, check=False).returncode == 0
        q = QueueClient(f"127.0.0.1:{port}", "jobs")
        q.set_token(ctx["secrets"]["JOBS_TOKEN"])
        q.init()
        index, _ = q.put(b"hello")
        q.close()
        with redis_server.client(5) as c:
            assert c.xlen("easq:jobs:records") == 1 and int(index) == 1  # the queue lives in Redis


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_the_worker_container_command_joins_the_gateway(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The remote worker Deployment's exact command line, run here against the gateway's: the
    worker registers (through what stands for the headless Service) and serves the model."""
    [worker] = _one("Deployment", "easkit-worker-digits")["spec"]["template"]["spec"]["containers"]
    (tmp_path / "gw").mkdir()
    with _gateway_from_manifests(redis_server, tmp_path / "gw", monkeypatch) as (port, ctx):
        secrets = ctx["secrets"]
        rpc = free_port()
        subst = {
            "http://easkit-gateway-pods:8080": f"http://127.0.0.1:{port}",
            "/models/digits.onnx": str(ROOT / "samples" / "models" / "digits.onnx"),
            "0.0.0.0": "127.0.0.1",
            "9000": str(rpc),
            "$(POD_IP)": "127.0.0.1",
        }
        entry = json.loads(next(a for w, a in ctx["instr"] if w == "ENTRYPOINT"))
        argv = [
            str(ROOT / ".venv" / "bin" / entry[0]),
            *entry[1:],
            *(subst.get(a, a) for a in worker["args"]),
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for var in worker["env"]:
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                env[var["name"]] = secrets[ref["key"]]
        log = (tmp_path / "worker.log").open("wb")
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, cwd=tmp_path, start_new_session=True)
        log.close()
        try:
            x = np.linspace(0, 16, 64, dtype=np.float32).reshape(1, 64)
            deadline = time.monotonic() + 30
            while True:
                req = TFRequest("serving_default")
                req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, x)
                try:
                    with PredictClient(
                        f"127.0.0.1:{port}", "digits", token=secrets["DIGITS_TOKEN"]
                    ) as client:
                        resp = client.predict(req)
                    break
                except Exception:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise AssertionError((tmp_path / "worker.log").read_text()[-3000:]) from None
                    time.sleep(0.2)
            assert len(resp.get_values("label")) == 1
            # Every service has a ready worker now.
            deadline = time.monotonic() + 10
            while _wait_http(f"http://127.0.0.1:{port}/readyz") != 200:
                assert time.monotonic() < deadline, "/readyz stays 503 with the remote worker joined"
                time.sleep(0.1)
            # The gateway publishes the gauge the workers' HPA follows, for the service it scales:
            # the service's min_workers while idle.
            hpa = _one("HorizontalPodAutoscaler", "easkit-worker-digits")["spec"]
            [metric] = [m["external"]["metric"] for m in hpa["metrics"] if m["type"] == "External"]
            labels = ",".join(f'{k}="{v}"' for k, v in metric["selector"]["matchLabels"].items())
            sample = f"{metric['name']}{{{labels}}} {float(hpa['minReplicas'])}"
            wait_until(lambda: sample in _metrics(port), 10, f"{sample!r} on /metrics")
        finally:
            proc.send_signal(signal.SIGTERM)  # deregisters, answers what it holds, exits
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        assert proc.returncode == 0, (tmp_path / "worker.log").read_text()[-3000:]


def test_the_redis_container_command_runs_here_with_the_persistence_the_queue_needs(tmp_path: Path) -> None:
    sts = _one("StatefulSet", "easkit-redis")
    [container] = sts["spec"]["template"]["spec"]["containers"]
    args = list(container["args"])
    args[args.index("--dir") + 1] = str(tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", *args[1:], "--port", str(port), "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL
    )
    try:
        import redis

        deadline = time.monotonic() + 10
        with redis.Redis(host="127.0.0.1", port=port) as c:
            while True:
                try:
                    c.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            conf = c.config_get("append*")
            assert (conf["appendonly"], conf["appendfsync"]) == ("yes", "everysec")
            assert c.config_get("save")["save"] == ""
    finally:
        proc.terminate()
        proc.wait(10)
