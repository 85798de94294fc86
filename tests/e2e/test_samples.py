"""The README's main job runs as documented: gateway + every sample client, then a clean stop."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_build_models_builds_every_model_services_yaml_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README "Try it" on a fresh checkout: build_models.py, then services.yaml loads (config
    validation checks that every model file exists)."""
    raw = yaml.safe_load((ROOT / "samples" / "services.yaml").read_text())
    needed = {Path(s["model"]).name for s in raw["services"] if s.get("processor") == "onnx"}
    assert "cluster_serving.onnx" in needed  # the async cs service
    fresh = tmp_path / "checkout"
    shutil.copytree(ROOT / "samples" / "processors", fresh / "samples" / "processors")
    shutil.copy(ROOT / "samples" / "services.yaml", fresh / "samples" / "services.yaml")
    out = fresh / "samples" / "models"
    built = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "build_models.py"), str(out)],
        cwd=ROOT, check=True, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert needed <= {p.name for p in out.glob("*.onnx")}
    # The build that takes seconds says what it is doing before it starts, then that it is done.
    lines = built.stdout.splitlines()
    assert lines[0].startswith("[1/4] digits.onnx: building (fitting a logistic regression"), lines
    assert re.fullmatch(r"\[1/4\] digits\.onnx: built in \d+\.\d s", lines[1]), lines
    monkeypatch.chdir(fresh)  # relative paths resolve here, not in this (already built) tree
    config = load_config("samples/services.yaml")
    models = {Path(s.model).name for s in config.services if s.processor == "onnx" and s.model}
    assert models == needed


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
        "kserve_client.py",
        "cluster_serving_client.py",
    ):
        assert f"== {client}" in out
