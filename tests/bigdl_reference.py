"""Run snippets under the real ``bigdl-serving`` 2.4.0 client (Cluster Serving over Redis).

It lives in its own virtual environment (.venv-bigdl, built by scripts/setup.sh from
requirements/bigdl.txt) and is driven through a subprocess, as tests/eas_reference.py
drives eas-prediction. Under CI a missing environment is an error, never a skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIGDL_PYTHON = Path(os.environ.get("BIGDL_PYTHON", ROOT / ".venv-bigdl" / "bin" / "python"))


def bigdl_python() -> str:
    if not BIGDL_PYTHON.exists():
        if os.environ.get("CI"):
            raise RuntimeError(f"bigdl-serving environment missing: {BIGDL_PYTHON}; run scripts/setup.sh")
        pytest.skip("bigdl-serving environment (.venv-bigdl) is not built")
    return str(BIGDL_PYTHON)


def run_bigdl(code: str, *args: str, timeout: float = 60.0) -> Any:
    """Run ``code`` with the bigdl-serving interpreter; it prints one JSON document last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONWARNINGS"] = "ignore"
    proc = subprocess.run(
        [bigdl_python(), "-c", code, *args], capture_output=True, timeout=timeout, env=env, check=False
    )
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace")[-4000:]
        raise AssertionError(f"bigdl-serving client failed (rc={proc.returncode}):\n{tail}")
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])
