"""scripts/bench.sh runs every benchmark with the same flags: each must accept them."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

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


_STUBS = {
    "bench_codec": (
        "from _harness import Target, report_targets\n"
        'ok = report_targets("bench_codec", [Target("codec: encode speedup", 42.0, ">=", 100, "x"),'
        ' Target("codec: decode time", 0.5, "<=", 1, "ms")])\n'
        "raise SystemExit(0 if ok else 1)"
    ),
    "bench_gateway": 'print("  p50 added at c=1:   +80 us   target <= 50 us   MISS")',
    "bench_worker_hop": 'print("rpc/http 2.1x")',
    "bench_batching": 'raise RuntimeError("wrk crashed")',
    "bench_queue": "raise SystemExit(3)",
    "bench_async": 'print("all good")',
}


def _fake_checkout(tmp_path: Path, stubs: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """scripts/bench.sh in a tree whose setup is a no-op and whose benchmarks are stubs."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "bench.sh", tmp_path / "scripts" / "bench.sh")
    (tmp_path / "scripts" / "setup.sh").write_text("exit 0\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    python = tmp_path / ".venv" / "bin" / "python"  # this environment's interpreter, site-packages and all
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    (tmp_path / "benchmarks").mkdir()
    for real in ("_harness.py", "summary.py"):
        shutil.copy(ROOT / "benchmarks" / real, tmp_path / "benchmarks" / real)
    for name, code in stubs.items():
        (tmp_path / "benchmarks" / f"{name}.py").write_text(f"import sys\nprint(sys.argv[1:])\n{code}\n")
    tools = tmp_path / "bin"  # wrk, redis-server and valgrind present: nothing to install
    tools.mkdir()
    for tool in ("wrk", "redis-server", "valgrind"):
        (tools / tool).write_text("#!/bin/sh\nexit 0\n")
        (tools / tool).chmod(0o755)
    return tmp_path, {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}


def test_bench_sh_runs_every_benchmark_and_reports_all_misses_at_the_end(tmp_path: Path) -> None:
    tree, env = _fake_checkout(tmp_path, {name: _STUBS.get(name, 'print("fine")') for name in BENCHES})
    out = subprocess.run(
        ["bash", str(tree / "scripts" / "bench.sh"), "--quick"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tree,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout
    for i, name in enumerate(BENCHES, 1):
        assert f"[{i}/{len(BENCHES)}] {name}" in text, name
        assert (tree / "benchmarks" / "results" / f"{name}.log").read_text().startswith("['--quick']")
    summary = text.split("=== summary ===", 1)[1]
    rows = {line.split()[0]: line for line in summary.splitlines()[2:] if line.startswith("bench_")}
    assert "MISS" in rows["bench_codec"] and "codec: encode speedup" in rows["bench_codec"]
    targets = text.split("=== targets ===", 1)[1].split("=== summary ===", 1)[0]
    assert re.search(r"codec: encode speedup\s+42\.00x\s+>= 100x\s+MISS", targets), targets
    assert re.search(r"codec: decode time\s+0\.50ms\s+<= 1ms\s+pass", targets), targets
    summary_json = json.loads((tree / "benchmarks" / "results" / "summary.json").read_text())
    assert [(r["scenario"], r["ok"]) for r in summary_json] == [
        ("codec: encode speedup", False),
        ("codec: decode time", True),
    ]
    assert (tree / "benchmarks" / "results" / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert "MISS" in rows["bench_gateway"] and "p50 added" in rows["bench_gateway"]
    assert "FAIL (exit 1)" in rows["bench_batching"] and "wrk crashed" in rows["bench_batching"]
    assert "ERROR (exit 3)" in rows["bench_queue"]
    assert rows["bench_worker_hop"].split()[1] == "pass" and rows["bench_async"].split()[1] == "pass"


def test_bench_sh_exits_zero_when_every_target_is_met(tmp_path: Path) -> None:
    tree, env = _fake_checkout(tmp_path, {name: 'print("fine")' for name in BENCHES})
    out = subprocess.run(
        ["bash", str(tree / "scripts" / "bench.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tree,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith("bench.sh: every target met")


def _summary_module() -> Any:
    spec = importlib.util.spec_from_file_location("_bench_summary", ROOT / "benchmarks" / "summary.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(bench: str, scenario: str, figure: float, op: str, goal: float | None) -> dict[str, Any]:
    ok = goal is None or (figure >= goal if op == ">=" else figure <= goal)
    return {
        "bench": bench,
        "scenario": scenario,
        "figure": figure,
        "op": op,
        "goal": goal,
        "unit": "x",
        "ok": ok,
    }


def test_summary_plot_puts_every_miss_first_grouped_by_benchmark(tmp_path: Path) -> None:
    summary = _summary_module()
    rows = [
        _row("bench_codec", "codec: encode", 157.0, ">=", 100),
        _row("bench_codec", "codec: time", 2.0, "<=", 1),
        _row("bench_gateway", "gateway: ratio", 0.67, ">=", 0.9),
        _row("bench_gateway", "gateway: floor", 0.8, "", None),
        _row("bench_queue", "queue: stream", 1.07, ">=", 0.5),
    ]
    order = [(bench, [r["scenario"] for r in group]) for bench, group in summary.plot_order(rows)]
    assert order == [
        ("bench_codec", ["codec: time"]),
        ("bench_gateway", ["gateway: ratio"]),
        ("bench_codec", ["codec: encode"]),
        ("bench_queue", ["queue: stream"]),
    ]
    # Over the goal, whichever way it points: more than 1 is met, less is missed.
    assert [round(summary.share_of_goal(r), 3) for r in rows if r["goal"]] == [1.57, 0.5, 0.744, 2.14]
    lost = [_row("bench_queue", "queue: records lost", n, "<=", 0) for n in (0, 3)]
    assert [summary.share_of_goal(r) for r in lost] == [2.0, 0.5]  # a goal of 0 has no ratio
    assert summary.plot(rows, tmp_path / "summary.png")
    assert (tmp_path / "summary.png").read_bytes()[:4] == b"\x89PNG"
