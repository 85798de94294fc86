"""One table of every benchmark's targets, after ``scripts/bench.sh`` ran them all.

Each benchmark writes its targets (``_harness.report_targets``) to
``benchmarks/results/<bench>.json``; this prints them as one table (scenario, figure, goal,
pass/miss), writes it as ``summary.json`` and, when matplotlib is installed, ``summary.png`` (each
figure over its goal on a log axis with the goal line at 1, grouped by benchmark, misses in
red and first, every bar labelled with its figure), and exits 1 if any goal was missed.

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


MISS_COLOUR, PASS_COLOUR, GOAL_COLOUR = "#d1242f", "#2da44e", "#24292f"
# How far from the goal a bar may reach (the label still gives the figure): a figure of 0
# over a ">=" goal needs a place on a log axis, and one far-off figure must not squeeze
# every other bar.
_FLOOR, _CEILING = 1e-2, 1e4


def share_of_goal(row: dict[str, Any]) -> float:
    """The figure over its goal, turned so that 1 is the goal and more is better, whichever
    way the goal points (for a "<=" goal, the goal over the figure). A goal of 0 (nothing
    lost) has no ratio: its row sits a fixed step right of the line when met, left when not."""
    figure, goal = float(row["figure"]), float(row["goal"])
    if goal == 0:
        return 2.0 if row["ok"] else 0.5
    # A figure of 0 under a "<=" goal (no wake-ups at all) is drawn a decade past the goal.
    share = figure / goal if row["op"] == ">=" else (goal / figure if figure else 10.0)
    return min(max(share, _FLOOR), _CEILING)


def plot_order(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows with a goal as ``(benchmark, rows)`` groups: every miss before any pass,
    grouped by benchmark within each, in the order they were measured. A benchmark with
    misses and passes has a group in both parts."""
    groups: dict[tuple[bool, str], list[dict[str, Any]]] = {}
    for met in (False, True):
        for r in rows:
            if r["goal"] is not None and bool(r["ok"]) is met:
                groups.setdefault((met, r["bench"]), []).append(r)
    return [(bench, group) for (_, bench), group in groups.items()]


def _scenario(bench: str, scenario: str) -> str:
    """The scenario under its benchmark's heading, without the heading's name again."""
    prefix = bench.removeprefix("bench_") + ": "
    return scenario.removeprefix(prefix)


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _label(row: dict[str, Any]) -> str:
    unit = row["unit"]
    return f"{_number(row['figure'])}{unit}  (goal {row['op']} {row['goal']:g}{unit})"


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """Each goal's figure over the goal on a log axis: a bar from the goal line (1) to the
    figure, right and green when the goal is met, left and red when missed; the misses
    first, grouped by benchmark, each bar labelled with its figure and its goal."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = plot_order(rows)
    if not groups:
        return False
    labels: list[str] = []
    heads: list[tuple[int, bool]] = []  # the rows that name a benchmark: (row, its rows missed)
    bars: list[tuple[int, dict[str, Any]]] = []
    for bench, group in groups:
        heads.append((len(labels), not group[0]["ok"]))
        labels.append(f"{bench} ({'missed' if not group[0]['ok'] else 'met'})")
        for r in group:
            bars.append((len(labels), r))
            labels.append(_scenario(bench, str(r["scenario"])))
    shares = [share_of_goal(r) for _, r in bars]
    lo, hi = min([*shares, 1.0]), max([*shares, 1.0])
    fig, ax = plt.subplots(figsize=(11, 0.3 * len(labels) + 1.6))
    ax.set_xscale("log")
    for (y, r), share in zip(bars, shares, strict=True):
        colour = PASS_COLOUR if r["ok"] else MISS_COLOUR
        ax.barh(y, share - 1.0, left=1.0, height=0.7, color=colour)
        # A tick at the figure: a near miss (0.79 against 0.8) has next to no bar.
        ax.plot([share], [y], marker="|", markersize=11, markeredgewidth=2.5, color=colour)
        # Every label right of the goal line, where a missed row has no bar: the misses'
        # labels stay clear of the scenario names.
        ax.annotate(
            _label(r), (max(share, 1.0), y), xytext=(6, 0), textcoords="offset points",
            ha="left", va="center", fontsize=8.5,
            color=GOAL_COLOUR if r["ok"] else MISS_COLOUR, fontweight="normal" if r["ok"] else "bold",
        )  # fmt: skip
    ax.axvline(1.0, color=GOAL_COLOUR, linewidth=1.5)
    ax.set_yticks(range(len(labels)), labels)
    ticks = ax.get_yticklabels()
    for i, missed in heads:
        ticks[i].set_fontweight("bold")
        ticks[i].set_color(MISS_COLOUR if missed else GOAL_COLOUR)
        if i:
            ax.axhline(i - 0.5, color="#d0d7de", linewidth=0.8)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(lo / 2, hi * 30)  # room for the labels right of the bars
    missed = sum(not r["ok"] for _, r in bars)
    ax.set_title(
        f"{missed} of {len(bars)} goals missed" if missed else f"every goal met ({len(bars)})",
        loc="left", fontsize=12, fontweight="bold", color=MISS_COLOUR if missed else PASS_COLOUR,
    )  # fmt: skip
    ax.set_xlabel("figure / goal, log scale: the line at 1 is the goal; right of it met, left missed")
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
