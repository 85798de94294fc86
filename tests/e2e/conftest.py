from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.gateway_proc import DIGITS_MODEL, ROOT, STARTED_LOGS, gateway_factory, token_leaks
from tests.redis_server import free_port

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


@pytest.fixture(autouse=True, scope="session")
def _no_token_in_any_gateway_log() -> Iterator[None]:
    """After the session: no configured token appears in any log of any gateway the tests ran."""
    yield
    leaks = token_leaks(STARTED_LOGS)
    assert not leaks, f"tokens found in gateway logs: {leaks}"


@pytest.fixture(scope="module")
def grpc_port() -> int:
    """A free port for the V2 gRPC endpoint of a module's gateway."""
    return free_port()
