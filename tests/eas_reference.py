"""Run snippets under the real ``eas-prediction`` 0.36 client.

The reference client needs protobuf <= 3.20.3, so it lives in its own virtual
environment (.venv-eas, built by scripts/setup.sh) and is driven through a
subprocess. Under CI a missing environment is an error, never a skip.
"""

from __future__ import annotations

import subprocess
import sys

from tests.client_venv import ROOT, interpreter, run_snippet, venv_python

REF_PYTHON = interpreter("EAS_REF_PYTHON", ".venv-eas")


def reference_python() -> str:
    return venv_python(REF_PYTHON, "eas-prediction reference", ".venv-eas")


def run_reference(
    code: str,
    *args: str,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    input_bytes: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``code`` with the reference interpreter; raise with its stderr on failure."""
    return run_snippet(
        reference_python(),
        code,
        *args,
        client="reference client",
        timeout=timeout,
        env=env,
        input_bytes=input_bytes,
    )


__all__ = ["ROOT", "reference_python", "run_reference", "sys"]
