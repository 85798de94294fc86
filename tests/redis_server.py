"""A real ``redis-server`` on a loopback port for tests (``scripts/setup.sh`` installs it).

Started with the persistence the queue documents for "survives a crash": no RDB
snapshots, the append-only file on (``appendfsync`` as asked), in its own directory.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    def __init__(self, workdir: Path, appendfsync: str = "everysec", port: int | None = None) -> None:
        self.workdir = workdir
        self.appendfsync = appendfsync
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 10.0) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed: run scripts/setup.sh (it installs it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            exe,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.workdir),
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--daemonize", "no",
            "--logfile", str(self.workdir / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1.0) as c:
                    # Loading the append-only file answers LOADING until done.
                    if c.ping():
                        return self
            except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server did not start on port {self.port}:\n{log}")
            time.sleep(0.02)

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, db=db)

    def kill(self) -> None:
        """SIGKILL: whatever the append-only file holds is what a restart finds."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()
