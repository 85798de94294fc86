"""The README's main job runs as documented: gateway + every sample client, then a clean stop."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_run_demo_succeeds() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "run_demo.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "all sample clients succeeded" in out
    assert "gateway stopped (exit code 0)" in out
    for client in (
        "string_client.py",
        "tf_client.py",
        "direct_client.py",
        "queue_client.py",
        "cluster_serving_client.py",
    ):
        assert f"== {client}" in out
