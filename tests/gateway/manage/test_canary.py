"""The canary's pieces without a gateway: durations, the judgement of a step's window, and a
run over figures the test moves itself (no clock: each step's window is handed in)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.config import ConfigError
from gateway.config.traffic import Traffic
from gateway.manage.canary import Canary, CanaryPlan, Window, judge, parse_duration


@pytest.mark.parametrize(
    ("raw", "seconds"), [(60, 60.0), ("60s", 60.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0)]
)
def test_durations(raw: Any, seconds: float) -> None:
    assert parse_duration(raw, "x") == seconds


@pytest.mark.parametrize(
    ("raw", "message"), [("soon", "expected a duration"), (0, "expected more than 0 s"), ("2d", "expected")]
)
def test_bad_durations_name_the_key(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=f"canary.interval_s: {message}"):
        parse_duration(raw, "canary.interval_s")


PLAN = CanaryPlan("2", (10, 100), 0.0, max_error_increase=0.02, max_p99_ratio=2.0, min_calls=5)


def test_judge() -> None:
    old = Window(100, 1, 0.010)
    assert judge(PLAN, "1", Window(50, 1, 0.012), old) is None
    assert "failed 20.0% of 50 calls against 1.0% for version 1" in (
        judge(PLAN, "1", Window(50, 10, 0.01), old) or ""
    )
    assert "p99 was 30.0 ms against 10.0 ms" in (judge(PLAN, "1", Window(50, 0, 0.030), old) or "")
    assert judge(PLAN, "1", Window(50, 0, 0.030), Window(0, 0, None)) is None  # no p99 to compare


class Figures:
    """Each version's figures, moved by the test; the bounds of a one-bucket histogram."""

    bounds = [1.0]

    def __init__(self) -> None:
        self.now: dict[str, tuple[int, int, list[int]]] = {"1": (0, 0, [0, 0]), "2": (0, 0, [0, 0])}

    def figures(self, service: str, version: str) -> tuple[int, int, list[int]]:
        return self.now[version]

    def add(self, version: str, calls: int, failed: int) -> None:
        c, f, b = self.now[version]
        self.now[version] = (c + calls, f + failed, [b[0] + calls, 0])


def test_a_run_promotes_a_healthy_version_and_rolls_back_a_failing_one() -> None:
    async def run(failed_at_second_step: int) -> tuple[Canary, list[tuple[Traffic, bool]]]:
        figures, applied = Figures(), []

        async def apply(traffic: Traffic, keep: bool) -> None:
            applied.append((traffic, keep))
            # The step's calls arrive once its split is set, while its window runs.
            later = asyncio.get_running_loop().call_soon
            if traffic == (("1", 90), ("2", 10)):
                later(figures.add, "1", 90, 0)
                later(figures.add, "2", 10, 0)
            elif traffic == (("1", 0), ("2", 100)) and not keep:
                later(figures.add, "2", 100, failed_at_second_step)

        canary = Canary("m", "1", PLAN, (("1", 100),), figures, apply)
        await asyncio.wait_for(canary.run(), 10)
        return canary, applied

    promoted, applied = asyncio.run(run(0))
    assert promoted.phase == "promoted" and applied[-1] == ((("1", 0), ("2", 100)), True)
    rolled, applied = asyncio.run(run(20))
    assert rolled.phase == "rolled back" and rolled.step == 100 and applied[-1] == ((("1", 100),), False)
    assert "failed 20.0% of 100 calls against 0.0% for version 1" in (rolled.reason or "")
