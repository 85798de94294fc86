"""Worker processes as the pool sees them: where their sockets live, their environment,
and noticing and reaping their exit without blocking the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

from gateway.config import ServiceConfig

_SOCKET_PATH_MAX = 107


def socket_dir() -> str:
    """A fresh private directory (0700) for the workers' unix sockets."""
    base = tempfile.gettempdir()
    # The path must leave room for "/w63.sock" under the 107-byte sun_path limit.
    if len(base) > _SOCKET_PATH_MAX - 32:
        base = "/tmp"  # noqa: S108 - fallback for very long TMPDIRs; the dir is private (0700)
    return tempfile.mkdtemp(prefix="easgw-", dir=base)


# What a worker keeps of the gateway's environment unasked: what an interpreter, its native
# libraries and a GPU need. Anything else (other services' tokens, credentials) only when a
# service's ``env:`` passes its name through.
BASE_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
    "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED",
    "VIRTUAL_ENV", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_HOME",
    "SSL_CERT_FILE", "SSL_CERT_DIR",
})  # fmt: skip
BASE_PREFIXES = ("LC_", "OMP_", "MKL_", "OPENBLAS_", "COVERAGE_")


def worker_env(service: ServiceConfig) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in BASE_ENV or k.startswith(BASE_PREFIXES)}
    env.update({k: os.environ[k] for k in service.env_pass if k in os.environ})
    env.update(service.env)
    # The worker imports this very package, wherever it was imported from.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when the process exits; None where the kernel lacks it."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(pid)
    except OSError:
        return None
    return fd


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            proc.kill()


async def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait (without blocking the loop) until the process has exited and is reaped."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)


__all__ = ["kill", "pidfd", "socket_dir", "wait_exit", "worker_env"]
