"""The progress lines of a service change, from the admin API's live state (the real
changes' lines: tests/e2e/test_services_e2e.py)."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest

from gateway.cli.progress import progress_line, with_progress


def _rollout(phase: str, ready: int, old: int, in_flight: int = 0) -> dict[str, Any]:
    return {"rollout": {"phase": phase, "new_workers": 2, "new_ready": ready, "old_workers": old,
                        "old_in_flight": in_flight, "elapsed_s": 1.0}}  # fmt: skip


def _workers(*states: str) -> dict[str, Any]:
    return {"workers": [{"state": s} for s in states]}


@pytest.mark.parametrize(
    ("doc", "line"),
    [
        (_rollout("starting", 1, 1), "rolling out: 1/2 new workers ready, 1 old serving"),
        (
            _rollout("draining", 2, 1, 3),
            "rolling out: 2/2 new workers ready, 1 old draining, 3 calls in flight",
        ),
        (
            _rollout("draining", 2, 1, 1),
            "rolling out: 2/2 new workers ready, 1 old draining, 1 call in flight",
        ),
        (_rollout("draining", 2, 0), "rolling out: 2/2 new workers ready, 0 old draining"),
        (_workers("ready", "starting", "starting"), "1/3 workers ready, 2 starting"),
        (_workers("ready", "draining"), "1/1 workers ready, 1 draining"),
        (_workers("ready", "ready"), None),
        ({"name": "a queue service"}, None),
    ],
)
def test_progress_lines(doc: dict[str, Any], line: str | None) -> None:
    assert progress_line(doc) == line


def test_a_line_each_time_the_state_changes_and_the_answer_or_error_at_the_end() -> None:
    states = iter([_workers("starting"), _workers("starting"), _workers("ready", "starting")])
    done = threading.Event()

    def look() -> dict[str, Any]:
        state = next(states, None)
        if state is None:
            done.set()
            return _workers("ready")
        return state

    out = io.StringIO()
    assert with_progress("svc", "scaling", lambda: done.wait(10) and "answer", look, out, 0.01) == "answer"
    lines = [line.rpartition(" (")[0] for line in out.getvalue().splitlines()]
    assert lines == [
        "service svc: scaling: 0/1 workers ready, 1 starting",
        "service svc: scaling: 1/2 workers ready, 1 starting",
    ]

    def fail() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        with_progress("svc", "scaling", fail, look, io.StringIO(), 0.01)
