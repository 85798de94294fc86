"""Run snippets under Paddle Serving's real ``PipelineClient`` (paddle-serving-server 0.9.0).

It lives in its own virtual environment (.venv-paddle, built by scripts/setup.sh from
requirements/paddle.txt: it needs protobuf 3.20.x) and is driven through a subprocess, as
tests/eas_reference.py drives eas-prediction. Under CI a missing environment is an error,
never a skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PADDLE_PYTHON = Path(os.environ.get("PADDLE_PYTHON", ROOT / ".venv-paddle" / "bin" / "python"))


def paddle_python() -> str:
    if not PADDLE_PYTHON.exists():
        if os.environ.get("CI"):
            raise RuntimeError(f"paddle-serving environment missing: {PADDLE_PYTHON}; run scripts/setup.sh")
        pytest.skip("paddle-serving environment (.venv-paddle) is not built")
    return str(PADDLE_PYTHON)


def run_paddle(code: str, *args: str, timeout: float = 60.0) -> Any:
    """Run ``code`` with the paddle-serving interpreter; it prints one JSON document last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONWARNINGS"] = "ignore"
    proc = subprocess.run(
        [paddle_python(), "-c", code, *args], capture_output=True, timeout=timeout, env=env, check=False
    )
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace")[-4000:]
        raise AssertionError(f"PipelineClient failed (rc={proc.returncode}):\n{tail}")
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])
