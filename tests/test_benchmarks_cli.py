"""scripts/bench.sh runs every benchmark with the same flags: each must accept them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LISTED = re.search(r"for bench in ([\w ]+); do", (ROOT / "scripts" / "bench.sh").read_text())
BENCHES = LISTED.group(1).split() if LISTED else []


def test_bench_sh_runs_every_benchmark() -> None:
    present = sorted(p.stem for p in (ROOT / "benchmarks").glob("bench_*.py"))
    assert sorted(BENCHES) == present


@pytest.mark.parametrize("bench", BENCHES)
def test_each_benchmark_takes_quick(bench: str) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{bench}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--quick" in out.stdout
