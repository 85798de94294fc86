"""Run snippets under the real ``eas-prediction`` 0.36 client.

The reference client needs protobuf <= 3.20.3, so it lives in its own virtual
environment (.venv-eas, built by scripts/setup.sh) and is driven through a
subprocess. Under CI a missing environment is an error, never a skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REF_PYTHON = Path(os.environ.get("EAS_REF_PYTHON", ROOT / ".venv-eas" / "bin" / "python"))


def reference_python() -> str:
    if not REF_PYTHON.exists():
        if os.environ.get("CI"):
            raise RuntimeError(f"reference interpreter missing: {REF_PYTHON}; run scripts/setup.sh")
        pytest.skip("eas-prediction reference environment (.venv-eas) is not built")
    return str(REF_PYTHON)


def run_reference(
    code: str,
    *args: str,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    input_bytes: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``code`` with the reference interpreter; raise with its stderr on failure."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    full_env["PYTHONWARNINGS"] = "ignore"
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [reference_python(), "-c", code, *args],
        capture_output=True,
        timeout=timeout,
        env=full_env,
        input=input_bytes,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"reference client failed (rc={proc.returncode}):\n{proc.stderr.decode(errors='replace')[-4000:]}"
        )
    return proc


__all__ = ["ROOT", "reference_python", "run_reference", "sys"]
