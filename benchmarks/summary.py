"""One table of every benchmark's targets, after ``scripts/bench.sh`` ran them all.

Each benchmark writes its targets (``_harness.report_targets``) to
``benchmarks/results/<bench>.json``; this prints them as one table (scenario, figure, goal,
pass/miss), writes it as ``summary.json`` and, when matplotlib is installed, ``summary.png``
(each figure as a share of its goal, misses in red), and exits 1 if any goal was missed.

Usage: ``python benchmarks/summary.py [results_dir]`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def load(results: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(results.glob("bench_*.json")):
        doc = json.loads(path.read_text())
        rows += [{"bench": doc["bench"], **t} for t in doc["targets"]]
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'scenario':<50}{'figure':>12}  {'goal':<12}result", "-" * 84]
    for r in rows:
        goal = f"{r['op']} {r['goal']:g}{r['unit']}" if r["goal"] is not None else "-"
        result = "-" if r["goal"] is None else "pass" if r["ok"] else "MISS"
        lines.append(f"{r['scenario']:<50}{r['figure']:>10.2f}{r['unit']:<2}  {goal:<12}{result}")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """Each goal's figure as a share of the goal (>= 1 is met, whichever way the goal points)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    goals = [r for r in rows if r["goal"]]
    if not goals:
        return False
    shares = [
        (r["figure"] / r["goal"]) if r["op"] == ">=" else (r["goal"] / r["figure"] if r["figure"] else 10.0)
        for r in goals
    ]
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(goals) + 1.2))
    colours = ["#1a7f37" if r["ok"] else "#c62828" for r in goals]
    ax.barh([r["scenario"] for r in goals], shares, color=colours)
    ax.axvline(1.0, color="#333", linewidth=1)
    ax.invert_yaxis()
    ax.set_xlabel("figure / goal (1 = the goal; right of the line: met)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str]) -> int:
    results = Path(argv[0]) if argv else RESULTS
    rows = load(results)
    print(table(rows))
    (results / "summary.json").write_text(json.dumps(rows, indent=2))
    drawn = plot(rows, results / "summary.png")
    print(f"written: {results / 'summary.json'}" + (f", {results / 'summary.png'}" if drawn else ""))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
