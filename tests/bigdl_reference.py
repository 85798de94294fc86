"""Run snippets under the real ``bigdl-serving`` 2.4.0 client (Cluster Serving over Redis).

It lives in its own virtual environment (.venv-bigdl, built by scripts/setup.sh from
requirements/bigdl.txt) and is driven through a subprocess, as tests/eas_reference.py
drives eas-prediction. Under CI a missing environment is an error, never a skip.
"""

from __future__ import annotations

from typing import Any

from tests.client_venv import interpreter, run_json, venv_python

BIGDL_PYTHON = interpreter("BIGDL_PYTHON", ".venv-bigdl")


def bigdl_python() -> str:
    return venv_python(BIGDL_PYTHON, "bigdl-serving", ".venv-bigdl")


def run_bigdl(code: str, *args: str, timeout: float = 60.0) -> Any:
    """Run ``code`` with the bigdl-serving interpreter; it prints one JSON document last."""
    return run_json(bigdl_python(), code, *args, client="bigdl-serving client", timeout=timeout)
