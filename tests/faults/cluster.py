"""The programs of one fault run, each inside its host's namespace: ``redis-server``, gateways
(``python -m gateway serve``), a remote worker (``python -m gateway worker``) and the load
generator (``python -m tests.faults.loadgen``).

Every program starts in a session of its own, so a signal reaches its whole group
(SIGSTOP/SIGCONT of a gateway pauses its workers too), and ``Cluster.close()`` kills every
group it started; the namespaces' own cleanup (netns.py) kills anything left inside them.
The programs listen on their namespace's address only: traffic never leaves the suite's
namespaces, so they run with ``EASGW_LOOPBACK_ONLY=0``.

A gateway started with ``clock=True`` runs under libfaketime (Debian's ``faketime``
package) with its wall clock read from a file the suite rewrites (``step_clock``), so the
running process sees its clock jump as an NTP step would make it: only the wall clock
(``FAKETIME_DONT_FAKE_MONOTONIC``; the kernel's monotonic clock never steps). libfaketime
0.9.10 then fails ``time.sleep`` with EINVAL (its ``clock_nanosleep`` wrapper); the
gateway's own waits are the event loop's and locks', which it leaves alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.faults.netns import Network

ROOT = Path(__file__).resolve().parents[2]
ECHO_ENTRY = f"{ROOT / 'samples' / 'processors' / 'echo.py'}:EchoProcessor"
TOKEN = "fault-suite-token-0123456789"
WORKER_TOKEN = "fault-suite-worker-0123456789abcdef"
QUEUE = "jobs"
SERVICE = "echo"
ASYNC_SERVICE = "aecho"  # asynchronous: its input queue and sink live in each gateway's own store
GATEWAYS_NAME = "gateways"  # resolves, in the worker's namespace, to every gateway
FAKETIME_LIBS = sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))
REDIS_PORT = 6379
GATEWAY_PORT = 8080


def wait_for(pred: Callable[[], bool], what: str, timeout: float, every: float = 0.1) -> float:
    """Poll ``pred`` until true; the seconds it took. Raises naming ``what`` at the deadline."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        if pred():
            return time.monotonic() - start
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout} s")
        time.sleep(every)


@dataclass
class Proc:
    name: str
    host: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes]

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def kill(self) -> None:
        if self.alive():
            self.signal(signal.SIGCONT)  # a stopped group still dies of SIGKILL, but be plain
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


@dataclass
class Cluster:
    net: Network
    workdir: Path
    procs: dict[str, Proc] = field(default_factory=dict)

    def start(self, name: str, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Proc:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / f"{name}.log"
        full_env = {**os.environ, "EASGW_LOOPBACK_ONLY": "0", "PYTHONUNBUFFERED": "1", **(env or {})}
        with log.open("ab") as out:
            popen = subprocess.Popen(
                self.net.exec_argv(host, argv),
                cwd=ROOT,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, host, list(argv), log, popen)
        self.procs[name] = proc
        return proc

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()

    # ------------------------------------------------------------------ redis
    def start_redis(self, aof: bool) -> Proc:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed: run scripts/setup.sh")
        data = self.workdir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            exe, "--bind", self.net.ip("redis"), "--port", str(REDIS_PORT), "--protected-mode", "no",
            "--dir", str(data), "--save", "", "--appendonly", "yes" if aof else "no",
            "--appendfsync", "everysec", "--daemonize", "no",
        ]  # fmt: skip
        proc = self.start("redis", "redis", argv)
        wait_for(self.redis_up, "redis-server answering", 15)
        return proc

    def redis_cli(self, *args: str) -> str:
        res = subprocess.run(
            self.net.exec_argv(
                "redis", ["redis-cli", "-h", self.net.ip("redis"), "-p", str(REDIS_PORT), *args]
            ),
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return res.stdout.strip()

    def redis_up(self) -> bool:
        return self.redis_cli("ping") == "PONG"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.net.ip('redis')}:{REDIS_PORT}/0"

    # ------------------------------------------------------------------ gateways and workers
    def gateway_config(self, host: str, queue: Mapping[str, Any], data_dir: Path) -> Path:
        ip = self.net.ip(host)
        cfg = {
            "gateway": {"data_dir": str(data_dir), "advertise_host": ip, "health_interval_s": 0.5},
            "services": [
                {"name": QUEUE, "processor": "queue", "token": TOKEN, "queue": dict(queue)},
                {
                    "name": ASYNC_SERVICE,
                    "processor": "python",
                    "entry": ECHO_ENTRY,
                    "token": TOKEN,
                    "workers": 1,
                    "async": True,
                },
                {
                    "name": SERVICE,
                    "processor": "python",
                    "entry": ECHO_ENTRY,
                    "token": TOKEN,
                    "workers": 0,
                    "timeout_ms": 2000,
                    "remote_workers": {"token": WORKER_TOKEN, "ttl_s": 1.5},
                },
            ],
        }
        path = self.workdir / f"{host}.yaml"
        self.workdir.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        return path

    def clock_file(self, host: str) -> Path:
        return self.workdir / f"{host}.clock"

    def step_clock(self, host: str, offset: str) -> None:
        """Set the wall clock of ``host``'s gateway to the real one plus ``offset`` (libfaketime's
        relative form: ``+0``, ``+2h``, ``-1d``); the process sees it at its next reading."""
        path = self.clock_file(host)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(offset + "\n", encoding="utf-8")
        tmp.replace(path)  # never a half-written file

    def start_gateway(
        self, host: str, queue: Mapping[str, Any], data_dir: Path | None = None, clock: bool = False
    ) -> Proc:
        data_dir = data_dir or self.workdir / f"{host}-data"
        config = self.gateway_config(host, queue, data_dir)
        env: dict[str, str] = {}
        if clock:
            if not FAKETIME_LIBS:
                raise RuntimeError("libfaketime is not installed: run scripts/setup.sh")
            self.step_clock(host, "+0")
            env = {
                "LD_PRELOAD": str(FAKETIME_LIBS[0]),
                "FAKETIME_TIMESTAMP_FILE": str(self.clock_file(host)),
                "FAKETIME_NO_CACHE": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            }
        port_file = self.workdir / f"{host}.port"
        port_file.unlink(missing_ok=True)
        argv = [
            sys.executable, "-m", "gateway", "serve", "--config", str(config), "--host", self.net.ip(host),
            "--port", str(GATEWAY_PORT), "--port-file", str(port_file), "--log-level", "INFO",
        ]  # fmt: skip
        proc = self.start(host, host, argv, env=env)

        def ready() -> bool:
            if not proc.alive():
                raise RuntimeError(f"gateway {host} exited:\n{proc.tail()}")
            return port_file.exists()

        wait_for(ready, f"gateway {host} listening", 60)
        return proc

    def url(self, host: str) -> str:
        return f"http://{self.net.ip(host)}:{GATEWAY_PORT}"

    def services(self, host: str, via: str = "client") -> dict[str, Any]:
        """``/api/services`` of the gateway on ``host``, asked from ``via``; {} without an answer."""
        status, body = self.net.curl(via, f"{self.url(host)}/api/services")
        if status != 200:
            return {}
        with contextlib.suppress(ValueError):
            doc = json.loads(body)
            items = doc.get("services", doc) if isinstance(doc, dict) else doc
            if isinstance(items, list):
                return {s["name"]: s for s in items if isinstance(s, dict) and "name" in s}
            return items if isinstance(items, dict) else {}
        return {}

    def ready_workers(self, host: str) -> int:
        svc = self.services(host).get(SERVICE, {})
        return sum(1 for w in svc.get("workers", []) if w.get("remote") and w.get("state") == "ready")

    def start_worker(self, gateways: Sequence[str], host: str = "worker") -> Proc:
        """One remote worker joining every gateway of ``gateways``: its ``--gateway`` is a
        name that resolves to all of them (as a headless Service does, docs/deploy.md)."""
        if len(gateways) == 1:
            url = self.url(gateways[0])
        else:
            self.net.resolve(host, GATEWAYS_NAME, gateways)
            url = f"http://{GATEWAYS_NAME}:{GATEWAY_PORT}"
        argv = [
            sys.executable, "-m", "gateway", "worker", "--gateway", url,
            "--service", SERVICE, "--entry", ECHO_ENTRY, "--host", self.net.ip(host), "--heartbeat", "0.5",
        ]  # fmt: skip
        proc = self.start(host, host, argv, env={"EAS_WORKER_TOKEN": WORKER_TOKEN})
        for gw in gateways:
            wait_for(lambda gw=gw: self.ready_workers(gw) >= 1, f"the remote worker ready on {gw}", 60, 0.3)  # type: ignore[misc]
        return proc
