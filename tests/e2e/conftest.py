from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.gateway_proc import DIGITS_MODEL, ROOT, gateway_factory

__all__ = ["digits_model", "gateway_factory"]


@pytest.fixture(scope="session")
def digits_model() -> Path:
    """samples/models/digits.onnx, built on first use (idempotent, about a second)."""
    if not DIGITS_MODEL.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "samples" / "build_models.py")],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=120,
        )
    assert DIGITS_MODEL.exists()
    return DIGITS_MODEL
