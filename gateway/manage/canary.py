"""Canary releases: a service's calls moved to a new model version step by step, rolled back
by the gateway itself when the new version does worse than the old one.

A canary names the new version, the steps (percents of the calls that name no version) and
how long each step lasts. At each step the split becomes ``{old: 100 - p, new: p}``; when
the step's window is over (and the new version has answered at least ``min_calls`` in it),
the new version's error rate (5xx) and p99 dispatch time over the window are set against
the old one's over the same window: an error rate more than ``max_error_increase`` above
the old one's, or a p99 more than ``max_p99_ratio`` times the old one's, rolls the split
back to what it was, at once. Past the last step the new version keeps its share (100 for a
full release). Blue-green is the one-step canary (``steps: [100]``): every call moves at
once while the old version's workers stay up, so switching back is one traffic change.

The old version is the one that takes the largest share when the canary starts. The outcome
is written to the service's history (gateway.manage.store).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from gateway.config import ConfigError, ServiceConfig
from gateway.config.traffic import Traffic
from gateway.observability.history import quantile

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
# The longest step: a canary is watched by an operator, not left for days.
MAX_INTERVAL_S = 86400.0


class VersionFigures(Protocol):
    """Each version's calls so far (gateway.observability.metrics keeps them)."""

    @property
    def bounds(self) -> list[float]: ...

    def figures(self, service: str, version: str) -> tuple[int, int, list[int]]: ...


def parse_duration(raw: Any, where: str) -> float:
    """``60``, ``60s``, ``500ms``, ``2m``, ``1h`` -> seconds (more than 0, at most a day)."""
    if isinstance(raw, bool):
        raise ConfigError(f"{where}: expected a duration such as 60s, got {raw!r}")
    if isinstance(raw, int | float):
        seconds = float(raw)
    else:
        match = _DURATION.match(str(raw))
        if match is None:
            raise ConfigError(f"{where}: expected a duration such as 60s, 500ms or 2m, got {str(raw)[:40]!r}")
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not 0.0 < seconds <= MAX_INTERVAL_S:
        raise ConfigError(
            f"{where}: expected more than 0 s and at most {MAX_INTERVAL_S:g} s, got {seconds:g} s"
        )
    return seconds


def _number(raw: Any, where: str, lo: float, hi: float) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not lo <= raw <= hi:
        raise ConfigError(f"{where}: expected a number from {lo:g} to {hi:g}, got {raw!r}")
    return float(raw)


@dataclass(frozen=True)
class CanaryPlan:
    version: str
    steps: tuple[int, ...]
    interval_s: float
    # How much higher than the old version's the new version's error rate may be (0.02: two points).
    max_error_increase: float = 0.02
    # How many times the old version's p99 the new version's may be.
    max_p99_ratio: float = 2.0
    # A step is judged once the new version has answered this many calls in its window.
    min_calls: int = 20

    def doc(self) -> dict[str, Any]:
        return {
            "version": self.version, "steps": list(self.steps), "interval_s": self.interval_s,
            "max_error_increase": self.max_error_increase, "max_p99_ratio": self.max_p99_ratio,
            "min_calls": self.min_calls,
        }  # fmt: skip


_PLAN_KEYS = ("version", "steps", "interval_s", "max_error_increase", "max_p99_ratio", "min_calls")


def parse_plan(raw: Any, svc: ServiceConfig) -> tuple[CanaryPlan, str]:
    """A canary's description -> (the plan, the old version it moves calls from); every
    refusal names the key."""
    if not isinstance(raw, dict):
        raise ConfigError('canary: expected {"version": N, "steps": [5, 25, 50, 100], "interval_s": 60}')
    unknown = sorted(set(raw) - set(_PLAN_KEYS))
    if unknown:
        raise ConfigError(f"canary: unknown key {unknown[0]!r}; expected {', '.join(_PLAN_KEYS)}")
    if len(svc.version_names) < 2:
        raise ConfigError(
            f"canary: service {svc.name!r} serves one version; "
            "list its versions (versions:) to release a new one"
        )
    if "version" not in raw:
        raise ConfigError("canary.version: required, the version to release")
    version = str(raw["version"]).strip()
    if version not in svc.version_names:
        raise ConfigError(
            f"canary.version: {version[:32]!r} is not one the service serves ({', '.join(svc.version_names)})"
        )
    old = old_version(svc)
    if version == old:
        raise ConfigError(f"canary.version: version {version} already takes the calls that name no version")
    steps = raw.get("steps", [100])
    if not isinstance(steps, list | tuple) or not steps:
        raise ConfigError("canary.steps: expected a list of percents, e.g. [5, 25, 50, 100]")
    for step in steps:
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= 100:
            raise ConfigError(f"canary.steps: expected whole percents from 1 to 100, got {step!r}")
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise ConfigError(f"canary.steps: expected rising percents, got {list(steps)}")
    interval = parse_duration(raw.get("interval_s", 60), "canary.interval_s")
    min_calls = raw.get("min_calls", 20)
    if isinstance(min_calls, bool) or not isinstance(min_calls, int) or not 1 <= min_calls <= 1_000_000:
        raise ConfigError(f"canary.min_calls: expected a whole number from 1 to 1000000, got {min_calls!r}")
    plan = CanaryPlan(
        version, tuple(steps), interval,
        _number(raw.get("max_error_increase", 0.02), "canary.max_error_increase", 0.0, 1.0),
        _number(raw.get("max_p99_ratio", 2.0), "canary.max_p99_ratio", 1.0, 1000.0),
        min_calls,
    )  # fmt: skip
    return plan, old


def old_version(svc: ServiceConfig) -> str:
    """The version that takes the largest share of the calls (the latest without a split)."""
    if not svc.traffic:
        return svc.version_names[-1]
    return max(svc.traffic, key=lambda vw: vw[1])[0]


@dataclass(frozen=True)
class Window:
    calls: int
    failed: int
    p99_s: float | None

    @property
    def error_rate(self) -> float:
        return self.failed / self.calls if self.calls else 0.0

    def doc(self) -> dict[str, Any]:
        p99 = None if self.p99_s is None else round(self.p99_s * 1000, 3)
        return {
            "calls": self.calls,
            "failed": self.failed,
            "error_rate": round(self.error_rate, 4),
            "p99_ms": p99,
        }


def _window(
    before: tuple[int, int, list[int]], after: tuple[int, int, list[int]], bounds: Sequence[float]
) -> Window:
    buckets = [a - b for a, b in zip(after[2], before[2], strict=True)]
    return Window(after[0] - before[0], after[1] - before[1], quantile(0.99, bounds, buckets))


def judge(plan: CanaryPlan, old: str, new: Window, base: Window) -> str | None:
    """Why the new version must be rolled back, or None when it does as well as the old."""
    if new.error_rate > base.error_rate + plan.max_error_increase:
        return (
            f"version {plan.version} failed {new.error_rate:.1%} of {new.calls} calls against "
            f"{base.error_rate:.1%} for version {old} (at most {plan.max_error_increase:.1%} more allowed)"
        )
    if new.p99_s is not None and base.p99_s is not None and new.p99_s > base.p99_s * plan.max_p99_ratio:
        return (
            f"version {plan.version}'s p99 was {new.p99_s * 1000:.1f} ms against {base.p99_s * 1000:.1f} ms "
            f"for version {old} (at most {plan.max_p99_ratio:g}x allowed)"
        )
    return None


# Sets the service's split (and, when the second argument is True, stores it as the service's own).
ApplySplit = Callable[[Traffic, bool], Awaitable[None]]


@dataclass
class Canary:
    service: str
    old: str
    plan: CanaryPlan
    original: Traffic
    figures: VersionFigures
    apply: ApplySplit
    phase: str = "starting"  # running, waiting for calls, promoted, rolled back, aborted, failed
    step: int = 0  # the percent the new version takes now
    windows: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    started_at: float = field(default_factory=time.monotonic)
    started_wall: str = field(default_factory=lambda: _now())
    ended_wall: str | None = None

    @property
    def done(self) -> bool:
        return self.phase in ("promoted", "rolled back", "aborted", "failed")

    def view(self) -> dict[str, Any]:
        return {
            "phase": self.phase, "version": self.plan.version, "from": self.old, "percent": self.step,
            "steps": list(self.plan.steps), "interval_s": self.plan.interval_s, "windows": list(self.windows),
            "reason": self.reason, "started": self.started_wall, "ended": self.ended_wall,
            "elapsed_s": round(time.monotonic() - self.started_at, 1),
        }  # fmt: skip

    def event(self) -> dict[str, Any]:
        """The history's record of the canary."""
        return {"kind": "canary", **self.view(), "plan": self.plan.doc()}

    def _split(self, percent: int) -> Traffic:
        share = {v: 0 for v, _ in self.original} or {}
        share[self.old], share[self.plan.version] = 100 - percent, percent
        return tuple(sorted(share.items(), key=lambda vw: int(vw[0])))

    async def run(self) -> None:
        """Every step in turn; ends promoted, rolled back (the original split back), or
        aborted when cancelled (the original split back, unless the gateway is stopping)."""
        plan, figures = self.plan, self.figures
        base: Window | None = None
        try:
            for percent in plan.steps:
                self.step, self.phase = percent, "running"
                await self.apply(self._split(percent), False)
                new0 = figures.figures(self.service, plan.version)
                old0 = figures.figures(self.service, self.old)
                await asyncio.sleep(plan.interval_s)
                # Judged on calls, not on an empty window: wait for enough of them.
                while figures.figures(self.service, plan.version)[0] - new0[0] < plan.min_calls:
                    self.phase = "waiting for calls"
                    await asyncio.sleep(min(plan.interval_s, 1.0))
                new = _window(new0, figures.figures(self.service, plan.version), figures.bounds)
                old = _window(old0, figures.figures(self.service, self.old), figures.bounds)
                # Set against the old version's window when it had calls enough to say
                # anything (at 100% it has none: the last such window stands), else against
                # no failure at all, with no p99 to compare.
                if old.calls >= plan.min_calls:
                    base = old
                against = base or Window(0, 0, None)
                self.windows.append({"percent": percent, "new": new.doc(), "old": against.doc()})
                self.reason = judge(plan, self.old, new, against)
                if self.reason is not None:
                    await self.apply(self.original, False)
                    self.phase = "rolled back"
                    return
            await self.apply(self._split(plan.steps[-1]), True)
            self.phase = "promoted"
        except asyncio.CancelledError:
            self.phase, self.reason = "aborted", self.reason or "aborted before the last step"
            raise
        finally:
            self.ended_wall = _now()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


__all__ = [
    "Canary",
    "CanaryPlan",
    "VersionFigures",
    "Window",
    "judge",
    "old_version",
    "parse_duration",
    "parse_plan",
]
