"""Run snippets under Paddle Serving's real ``PipelineClient`` (paddle-serving-server 0.9.0).

It lives in its own virtual environment (.venv-paddle, built by scripts/setup.sh from
requirements/paddle.txt: it needs protobuf 3.20.x) and is driven through a subprocess, as
tests/eas_reference.py drives eas-prediction. Under CI a missing environment is an error,
never a skip.
"""

from __future__ import annotations

import tempfile
from typing import Any

from tests.client_venv import interpreter, run_json, venv_python

PADDLE_PYTHON = interpreter("PADDLE_PYTHON", ".venv-paddle")


def paddle_python() -> str:
    return venv_python(PADDLE_PYTHON, "paddle-serving", ".venv-paddle")


def run_paddle(code: str, *args: str, timeout: float = 60.0) -> Any:
    """Run ``code`` with the paddle-serving interpreter; it prints one JSON document last. It
    runs in a folder of its own: the client writes its logs (PipelineServingLogs/) where it runs."""
    with tempfile.TemporaryDirectory(prefix="paddle-client-") as cwd:
        return run_json(paddle_python(), code, *args, client="PipelineClient", timeout=timeout, cwd=cwd)
