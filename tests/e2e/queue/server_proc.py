"""The queue-only server (``python -m gateway.queue.server``) as a subprocess for tests, and
the full gateway (``python -m gateway serve``) behind the same interface."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "queue-test-token"


def queue_config(data_dir: Path, names: list[str], **queue: Any) -> dict[str, Any]:
    return {
        "gateway": {"host": "127.0.0.1", "port": 0, "data_dir": str(data_dir)},
        "services": [{"name": n, "processor": "queue", "token": TOKEN, "queue": dict(queue)} for n in names],
    }


class QueueServer:
    """Start with ``QueueServer.start(config, workdir)``; ``kill()`` is SIGKILL, ``stop()`` SIGTERM."""

    def __init__(self, proc: subprocess.Popen[bytes], workdir: Path, port: int, config: Path) -> None:
        self.proc = proc
        self.workdir = workdir
        self.port = port
        self.config = config

    @classmethod
    def start(cls, config: Mapping[str, Any] | Path, workdir: Path, timeout: float = 30.0) -> QueueServer:
        workdir.mkdir(parents=True, exist_ok=True)
        if isinstance(config, Mapping):
            path = workdir / "queue.yaml"
            path.write_text(yaml.safe_dump(dict(config)), encoding="utf-8")
        else:
            path = config
        port_file = workdir / "queue.port"
        port_file.unlink(missing_ok=True)
        log = (workdir / "server.log").open("ab")
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gateway.queue.server",
                    "--config",
                    str(path),
                    "--port-file",
                    str(port_file),
                ],
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if port_file.exists():
                return cls(proc, workdir, int(port_file.read_text().strip().rpartition(":")[2]), path)
            if proc.poll() is not None:
                raise RuntimeError(f"queue server exited early:\n{cls.log_of(workdir)}")
            time.sleep(0.05)
        cls._kill(proc)
        raise RuntimeError(f"queue server not ready:\n{cls.log_of(workdir)}")

    def restart(self) -> QueueServer:
        """A new process on the same config and data directory."""
        return QueueServer.start(self.config, self.workdir)

    @staticmethod
    def log_of(workdir: Path) -> str:
        p = workdir / "server.log"
        return p.read_text(errors="replace")[-4000:] if p.exists() else ""

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)

    def kill(self) -> None:
        self._kill(self.proc)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self._kill(self.proc)
        return self.proc.returncode


class GatewayServer:
    """The full gateway (``python -m gateway serve``: its lean front, the predict route's queue
    checks, then the same QueueManager) with QueueServer's interface."""

    def __init__(self, proc: Any, config: Mapping[str, Any], workdir: Path) -> None:
        self.proc = proc
        self.config = config
        self.workdir = workdir

    @classmethod
    def start(cls, config: Mapping[str, Any], workdir: Path) -> GatewayServer:
        from tests.e2e.gateway_proc import GatewayProcess

        cfg = dict(config)
        cfg["gateway"] = {**cfg.get("gateway", {}), "access_log": False}
        return cls(GatewayProcess.start(cfg, workdir), cfg, workdir)

    def restart(self) -> GatewayServer:
        """A new process on the same config and data directory."""
        return GatewayServer.start(self.config, self.workdir)

    @property
    def port(self) -> int:
        return int(self.proc.port)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        self.proc.kill()

    def stop(self) -> int | None:
        return int(self.proc.stop())


SERVERS = {"queue-server": QueueServer, "gateway": GatewayServer}


def wait_serving(port: int, name: str, timeout: float = 15.0) -> None:
    """Until the server answers a count on the queue (a restarted server on Redis waits for
    the killed one's lease to expire)."""
    deadline = time.monotonic() + timeout
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", f"/api/predict/{name}?_count_=true", headers={"Authorization": TOKEN})
            if conn.getresponse().status == 200:
                return
        finally:
            conn.close()
        if time.monotonic() > deadline:
            raise TimeoutError(f"queue {name} not served within {timeout} s")
        time.sleep(0.1)
