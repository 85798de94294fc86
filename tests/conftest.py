"""Suite-wide guards: loopback-only networking and no leaked child processes."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.redis_server import RedisServer

os.environ.setdefault("EASGW_LOOPBACK_ONLY", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-minutes",
        type=float,
        default=None,
        help="length of the long soak (tests/soak, -m soak); else EASKIT_SOAK_MINUTES, else 30",
    )


_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex
# This machine's own non-loopback addresses a test listens on (allow_own_address): calls to
# them stay on the machine.
_OWN_ADDRESSES: set[str] = set()


def allow_own_address(host: str) -> None:
    """Let tests connect to ``host``, one of this machine's own interface addresses (a
    gateway listening there sees callers that are not loopback)."""
    _OWN_ADDRESSES.add(host)


def _check_address(address: object) -> None:
    if isinstance(address, tuple) and address:
        host = address[0]
        if host in ("localhost",) or host in _OWN_ADDRESSES:
            return
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise RuntimeError(f"test tried to resolve/connect to non-loopback host {host!r}") from None
        if not ip.is_loopback:
            raise RuntimeError(f"test tried to connect to non-loopback address {host!r}")


def _guarded_connect(self: socket.socket, address: object) -> None:
    _check_address(address)
    return _real_connect(self, address)  # type: ignore[arg-type]


def _guarded_connect_ex(self: socket.socket, address: object) -> int:
    _check_address(address)
    return _real_connect_ex(self, address)  # type: ignore[arg-type]


@pytest.fixture(autouse=True, scope="session")
def _loopback_only() -> Iterator[None]:
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
    yield
    socket.socket.connect = _real_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _real_connect_ex  # type: ignore[method-assign]


def _is_resource_tracker(p: psutil.Process) -> bool:
    try:
        return "multiprocessing.resource_tracker" in " ".join(p.cmdline())
    except psutil.Error:
        return False


@pytest.fixture(autouse=True, scope="session")
def _no_leaked_children() -> Iterator[None]:
    yield
    # multiprocessing's resource tracker (started by the gateway's parser process) belongs to
    # this test process and ends with it.
    leftovers = [
        p for p in psutil.Process().children(recursive=True) if p.is_running() and not _is_resource_tracker(p)
    ]
    for p in leftovers:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    names = [f"{p.pid}:{' '.join(p.cmdline()[:4]) if p.is_running() else '?'}" for p in leftovers]
    assert not leftovers, f"tests leaked child processes: {names}"


@pytest.fixture(autouse=True, scope="session")
def _sample_models() -> None:
    """Build the sample models (samples/models/, git-ignored) once, before any test needs them,
    so no test depends on another having built them first. Idempotent: about a second."""
    root = Path(__file__).resolve().parent.parent
    for script in ("build_models.py", "build_cluster_serving_model.py"):
        subprocess.run(
            [sys.executable, str(root / "samples" / script)],
            cwd=root,
            check=True,
            capture_output=True,
            timeout=180,
        )


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the session (loopback, random port, append-only file on).
    Tests take a database of their own or flush the one they use first."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()
