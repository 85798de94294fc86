"""Reference clients that live in virtual environments of their own (their pinned protobuf or
numpy would clash with ours), driven through a subprocess: each ``tests/*_reference.py`` names
its interpreter and runs snippets under it with these two calls."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def interpreter(env_var: str, venv: str) -> Path:
    """The interpreter ``$ENV_VAR`` names, else ``VENV/bin/python`` in this checkout."""
    return Path(os.environ.get(env_var, ROOT / venv / "bin" / "python"))


def venv_python(python: Path, what: str, venv: str) -> str:
    """``python``, the interpreter of ``what``'s environment (``venv``, built by scripts/setup.sh).
    A missing one skips the test, and under CI fails it: a suite never passes by skipping."""
    if not python.exists():
        if os.environ.get("CI"):
            raise RuntimeError(f"{what} environment missing: {python}; run scripts/setup.sh")
        pytest.skip(f"{what} environment ({venv}) is not built")
    return str(python)


def run_snippet(
    python: str,
    code: str,
    *args: str,
    client: str,
    timeout: float,
    env: dict[str, str] | None = None,
    input_bytes: bytes | None = None,
    cwd: str | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``code`` with ``python``, our own Python settings left out (``env`` added); a failure
    raises with the end of its stderr, naming ``client``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    full_env["PYTHONWARNINGS"] = "ignore"
    full_env.update(env or {})
    proc = subprocess.run(
        [python, "-c", code, *args],
        capture_output=True,
        timeout=timeout,
        env=full_env,
        input=input_bytes,
        check=False,
        cwd=cwd,
    )
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace")[-4000:]
        raise AssertionError(f"{client} failed (rc={proc.returncode}):\n{tail}")
    return proc


def run_json(python: str, code: str, *args: str, client: str, timeout: float, cwd: str | None = None) -> Any:
    """:func:`run_snippet` for a snippet that prints one JSON document last: that document."""
    proc = run_snippet(python, code, *args, client=client, timeout=timeout, cwd=cwd)
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])
