"""Run the real gateway as a subprocess (reusable by any test).

    proc = GatewayProcess.start(config_dict_or_path, tmp_path)
    proc.url, proc.port, proc.pid, proc.output(), proc.stop() -> exit status

The gateway runs ``python -m gateway serve --host 127.0.0.1 --port 0 --port-file F``
in its own session; ``stop()``/``kill()`` signal the whole process group, so
workers never outlive a test. The ``gateway_factory`` fixture kills whatever is
left in its finalizer.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DIGITS_MODEL = ROOT / "samples" / "models" / "digits.onnx"
ECHO_ENTRY = f"{ROOT / 'samples' / 'processors' / 'echo.py'}:EchoProcessor"


# Every gateway a test started and the tokens its config holds: when the session ends,
# tests/e2e/conftest.py scans their logs (workers' included) for any of those tokens.
STARTED_LOGS: list[tuple[Path, tuple[str, ...]]] = []


def config_tokens(config: Mapping[str, Any]) -> tuple[str, ...]:
    """Every token a gateway config (as a mapping) names."""
    out: list[str] = []
    for svc in config.get("services") or []:
        if isinstance(svc, Mapping):
            out += [t for t in [svc.get("token"), *(svc.get("tokens") or [])] if isinstance(t, str) and t]
    return tuple(out)


def thread_policies(pid: int) -> set[int]:
    """The kernel's scheduling policies of a process's threads (field 41 of each thread's stat)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            found.add(int((task / "stat").read_text().rsplit(")", 1)[1].split()[38]))
    return found


def token_leaks(started: list[tuple[Path, tuple[str, ...]]]) -> list[str]:
    """'<log file>: <token prefix>...' for each configured token found in a gateway's log.
    Tokens shorter than 8 characters are skipped: they could appear by chance."""
    leaks = []
    for workdir, tokens in started:
        for name in ("stdout.log", "stderr.log"):
            path = workdir / name
            if not path.exists():
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            leaks += [f"{path}: {t[:3]}..." for t in tokens if len(t) >= 8 and t in text]
    return leaks


def digits_on_workers(model: Path | str, token: str, workers: int = 2) -> dict[str, Any]:
    """A ``digits`` service on worker processes (``placement: process``), for the tests of
    what workers do; an onnx service with no placement runs in the gateway's threads."""
    return {
        "name": "digits", "processor": "onnx", "placement": "process", "model": str(model),
        "token": token, "workers": workers,
    }  # fmt: skip


def in_threads(n: int, run: Callable[[int], None], threads: int = 4) -> None:
    """``run(count)`` in ``threads`` threads at once, the ``n`` calls shared out among them."""
    started = [threading.Thread(target=run, args=(n // threads + (i < n % threads),)) for i in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join()


def raw_post(
    port: int,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    chunked: bool = False,
    timeout: float = 10.0,
) -> tuple[int, dict[str, str], bytes]:
    """One POST on a connection of its own -> (status, headers by lower-case name, body): what
    a test needs of an answer whose bytes or headers it checks as they came."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if chunked:
            conn.request("POST", path, body=iter([body]), headers=dict(headers), encode_chunked=True)
        else:
            conn.request("POST", path, body=body, headers=dict(headers))
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


class GatewayProcess:
    def __init__(
        self, proc: subprocess.Popen[bytes], workdir: Path, port: int, host: str = "127.0.0.1"
    ) -> None:
        self.proc = proc
        self.host = host
        self.workdir = workdir
        self.port = port
        self.pid = proc.pid

    # ------------------------------------------------------------------ start/stop
    @classmethod
    def start(
        cls,
        config: Mapping[str, Any] | str | os.PathLike[str],
        workdir: Path,
        *,
        env: Mapping[str, str] | None = None,
        log_level: str = "INFO",
        extra_args: tuple[str, ...] = (),
        timeout: float = 60.0,
        serve_args: tuple[str, ...] | None = None,
        host: str = "127.0.0.1",
        python: str | None = None,
    ) -> GatewayProcess:
        """``serve_args`` replaces ``--config FILE`` (``--model``, ``--model-repository``);
        ``host`` other than loopback needs ``env={"EASGW_LOOPBACK_ONLY": "0"}``; ``python``:
        the interpreter to run it with (default this one; another environment needs the
        checkout on its path, ``env={"PYTHONPATH": str(ROOT)}``, where easkit is not installed)."""
        workdir.mkdir(parents=True, exist_ok=True)
        if serve_args is not None:
            path = None
        elif isinstance(config, Mapping):
            cfg = dict(config)
            cfg.setdefault("gateway", {})
            cfg["gateway"] = {"data_dir": str(workdir / "data"), **cfg["gateway"]}
            # Services the test gives no token are declared open, as the config requires.
            cfg["services"] = [
                s if {"token", "tokens", "public"} & set(s) else {**s, "public": True}
                for s in cfg.get("services") or []
            ]
            path = workdir / "services.yaml"
            path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        else:
            path = Path(config)
        raw = config if isinstance(config, Mapping) else yaml.safe_load(path.read_text(encoding="utf-8"))
        STARTED_LOGS.append((workdir, config_tokens(raw if isinstance(raw, Mapping) else {})))
        port_file = workdir / "gateway.port"
        port_file.unlink(missing_ok=True)
        full_env = {**os.environ, "EASGW_LOOPBACK_ONLY": "1", "PYTHONUNBUFFERED": "1"}
        if env:
            full_env.update(env)
        what = ["--config", str(path)] if serve_args is None else list(serve_args)
        argv = [
            python or sys.executable, "-m", "gateway", "serve", *what,
            "--host", host, "--port", "0", "--port-file", str(port_file),
            "--log-level", log_level, *extra_args,
        ]  # fmt: skip
        out = (workdir / "stdout.log").open("ab")
        err = (workdir / "stderr.log").open("ab")
        try:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=full_env, stdout=out, stderr=err, start_new_session=True
            )
        finally:
            out.close()
            err.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if port_file.exists():
                text = port_file.read_text().strip()
                bound, _, port = text.rpartition(":")
                assert bound == host, text
                return cls(proc, workdir, int(port), host)
            if proc.poll() is not None:
                tail = cls._tail(workdir)
                raise RuntimeError(f"gateway exited with {proc.returncode} before it was ready:\n{tail}")
            time.sleep(0.05)
        _kill_group(proc)
        raise RuntimeError(f"gateway not ready within {timeout} s:\n{cls._tail(workdir)}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the gateway (not its workers: it stops them) and wait; kill the group if stuck."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_group(self.proc)
                raise
        _kill_group(self.proc)  # anything left in the group (should be nothing)
        return self.proc.returncode

    def kill(self) -> None:
        _kill_group(self.proc)

    # ------------------------------------------------------------------ helpers
    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def endpoint(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def output(self) -> str:
        return "".join(
            (self.workdir / name).read_text(encoding="utf-8", errors="replace")
            for name in ("stdout.log", "stderr.log")
            if (self.workdir / name).exists()
        )

    @staticmethod
    def _tail(workdir: Path) -> str:
        parts = []
        for name in ("stdout.log", "stderr.log"):
            p = workdir / name
            if p.exists():
                parts.append(p.read_text(encoding="utf-8", errors="replace")[-4000:])
        return "\n".join(parts)

    def get_json(self, path: str, timeout: float = 5.0) -> tuple[int, Any]:
        return self.call_json(path, timeout=timeout)

    def call_json(
        self, path: str, doc: Any = None, headers: Mapping[str, str] | None = None, timeout: float = 10.0
    ) -> tuple[int, Any]:
        """A GET, or a POST of ``doc`` (JSON, or bytes sent as they are) -> (status, the JSON
        answer), an error's answer included."""
        data = None if doc is None else doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=dict(headers or {}))
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def services(self) -> dict[str, Any]:
        status, body = self.get_json("/api/services")
        assert status == 200
        return {s["name"]: s for s in body["services"]}

    def worker_pids(self, service: str | None = None) -> list[int]:
        if service is not None:
            return [w["pid"] for w in self.services()[service].get("workers", []) if w.get("pid")]
        try:
            return [c.pid for c in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def wait_workers_ready(self, service: str, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        workers: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            workers = self.services()[service].get("workers", [])
            if sum(1 for w in workers if w.get("state") == "ready") >= count:
                return workers
            time.sleep(0.1)
        raise AssertionError(f"{service}: fewer than {count} ready workers after {timeout} s: {workers}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[Any]:
    """``start(config, name="gw", **kw) -> GatewayProcess``; every process group is killed afterwards."""
    started: list[GatewayProcess] = []

    def start(config: Mapping[str, Any] | str, name: str = "gw", **kw: Any) -> GatewayProcess:
        proc = GatewayProcess.start(config, tmp_path / name, **kw)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
