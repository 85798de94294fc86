"""The documentation site builds: ``sphinx-build -W`` (every warning an error) over docs/,
with the Furo theme, MyST Markdown and the autodoc API reference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.gateway_proc import ROOT


@pytest.mark.timeout(180)
def test_the_site_builds_without_warnings(tmp_path: Path) -> None:
    out = tmp_path / "html"
    argv = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    argv += ["-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    pages = {p.name for p in out.glob("*.html")}
    sources = {p.stem + ".html" for p in (ROOT / "docs").glob("*.md")}
    assert sources <= pages, sources - pages  # every page is on the site
    api = (out / "api.html").read_text()
    assert 'id="eas_sdk.predict.PredictClient.predict"' in api  # autodoc read the docstrings
    assert 'id="eas_sdk.errors.ConnectError"' in api
    assert "furo" in (out / "index.html").read_text()
    reference = (out / "configuration.html").read_text()  # generated from the config schema
    for key in ("max_body_bytes", "batching.max_batch_size", "queue.fsync", "stall_timeout_s"):
        assert f'<span class="pre">{key}</span></code></p></td>' in reference, key
