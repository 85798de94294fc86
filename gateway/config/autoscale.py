"""A service's autoscaling: ``autoscale: {min_workers, max_workers, target}``.

The gateway's control loop (gateway.manage.autoscale) keeps ``ceil(load / target)`` workers,
where the load is the calls in flight (and, for an asynchronous service, the records waiting
in its input queue), within ``[min_workers, max_workers]``: up at once, down only once the
load has stayed lower for ``scale_down_after_s``. ``min_workers: 0`` lets an idle service
(no call for ``idle_after_s``) stop its last worker; the next call starts one and waits for
it, with at most ``max_waiting`` calls waiting. ``schedule:`` entries (cron expressions, UTC)
change the bounds from the time they fire, as PAI-EAS's scheduled scaling does.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from gateway.config.values import ConfigError, check_keys

MAX_WORKERS = 64
_KEYS = (
    "min_workers",
    "max_workers",
    "target",
    "scale_down_after_s",
    "idle_after_s",
    "max_waiting",
    "schedule",
)
_ENTRY_KEYS = ("cron", "min_workers", "max_workers")


@dataclass(frozen=True)
class ScheduledBounds:
    """From each time ``cron`` fires, these bounds (None: the service's own) apply, until the
    next entry fires."""

    cron: str
    min_workers: int | None = None
    max_workers: int | None = None


@dataclass(frozen=True)
class AutoscaleConfig:
    min_workers: int = 1
    max_workers: int = 4
    # In-flight calls (and queued records, for an asynchronous service) per worker.
    target: float = 4.0
    scale_down_after_s: float = 60.0
    idle_after_s: float = 300.0
    # Calls that may wait for a worker to start from zero; past it: 503 at once.
    max_waiting: int = 64
    schedule: tuple[ScheduledBounds, ...] = ()

    def bounds_at(self, now: dt.datetime) -> tuple[int, int]:
        """(min, max) workers at ``now``: the entry that fired last, else the service's own."""
        if not self.schedule:
            return self.min_workers, self.max_workers
        from croniter import croniter

        latest: tuple[dt.datetime, ScheduledBounds] | None = None
        for entry in self.schedule:
            fired = croniter(entry.cron, now).get_prev(dt.datetime)
            if latest is None or fired >= latest[0]:
                latest = (fired, entry)
        assert latest is not None
        entry = latest[1]
        lo = self.min_workers if entry.min_workers is None else entry.min_workers
        hi = self.max_workers if entry.max_workers is None else entry.max_workers
        return lo, hi


def _whole(raw: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not lo <= raw <= hi:
        raise ConfigError(f"{where}: expected a whole number from {lo} to {hi}, got {raw!r}")
    return raw


def _positive(raw: Any, where: str, *, zero: bool = False) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw < 0 or (raw == 0 and not zero):
        raise ConfigError(f"{where}: expected a number {'>=' if zero else '>'} 0, got {raw!r}")
    return float(raw)


def _cron(raw: Any, where: str) -> str:
    try:
        from croniter import croniter
    except ImportError:  # pragma: no cover - the gateway extra installs it
        raise ConfigError(f"{where}: scheduled scaling needs croniter (easkit[gateway])") from None
    if not isinstance(raw, str) or not raw.strip() or not croniter.is_valid(raw.strip()):
        raise ConfigError(
            f"{where}: {str(raw)[:64]!r} is not a cron expression (minute hour day month weekday, "
            "e.g. '0 8 * * 1-5')"
        )
    return raw.strip()


def _entry(raw: Any, where: str, base_min: int, base_max: int) -> ScheduledBounds:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with cron and min_workers and/or max_workers")
    check_keys(raw, set(_ENTRY_KEYS), where)
    cron = _cron(raw.get("cron"), f"{where}.cron")
    lo, hi = (
        None if raw.get(key) is None else _whole(raw[key], f"{where}.{key}", low, MAX_WORKERS)
        for key, low in (("min_workers", 0), ("max_workers", 1))
    )
    if lo is None and hi is None:
        raise ConfigError(f"{where}: give min_workers, max_workers or both")
    if (base_min if lo is None else lo) > (base_max if hi is None else hi):
        key = "min_workers" if lo is not None else "max_workers"
        raise ConfigError(
            f"{where}.{key}: min_workers {base_min if lo is None else lo} is above "
            f"max_workers {base_max if hi is None else hi}"
        )
    return ScheduledBounds(cron, lo, hi)


def parse_autoscale(raw: Any, where: str) -> AutoscaleConfig | None:
    """``autoscale:`` -> its settings (None: the worker count is fixed); ``where`` names the
    key in every error (``services[0] (m).autoscale``)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping (min_workers, max_workers, target, ...)")
    check_keys(raw, set(_KEYS), where)
    d = AutoscaleConfig()
    lo = _whole(raw.get("min_workers", d.min_workers), f"{where}.min_workers", 0, MAX_WORKERS)
    hi = _whole(raw.get("max_workers", max(d.max_workers, lo)), f"{where}.max_workers", 1, MAX_WORKERS)
    if lo > hi:
        raise ConfigError(f"{where}.min_workers: {lo} is above max_workers {hi}")
    schedule = raw.get("schedule") or []
    if not isinstance(schedule, list):
        raise ConfigError(f"{where}.schedule: expected a list of {{cron, min_workers, max_workers}}")
    return AutoscaleConfig(
        min_workers=lo,
        max_workers=hi,
        target=_positive(raw.get("target", d.target), f"{where}.target"),
        scale_down_after_s=_positive(
            raw.get("scale_down_after_s", d.scale_down_after_s), f"{where}.scale_down_after_s", zero=True
        ),
        idle_after_s=_positive(raw.get("idle_after_s", d.idle_after_s), f"{where}.idle_after_s", zero=True),
        max_waiting=_whole(raw.get("max_waiting", d.max_waiting), f"{where}.max_waiting", 1, 1 << 20),
        schedule=tuple(_entry(e, f"{where}.schedule[{i}]", lo, hi) for i, e in enumerate(schedule)),
    )


def autoscale_doc(cfg: AutoscaleConfig) -> dict[str, Any]:
    """The settings as the config file writes them (the admin API's service description)."""
    d = AutoscaleConfig()
    out: dict[str, Any] = {
        "min_workers": cfg.min_workers,
        "max_workers": cfg.max_workers,
        "target": cfg.target,
    }
    for key in ("scale_down_after_s", "idle_after_s", "max_waiting"):
        if getattr(cfg, key) != getattr(d, key):
            out[key] = getattr(cfg, key)
    if cfg.schedule:
        out["schedule"] = [
            {
                "cron": e.cron,
                **{
                    k: v
                    for k, v in (("min_workers", e.min_workers), ("max_workers", e.max_workers))
                    if v is not None
                },
            }
            for e in cfg.schedule
        ]
    return out


__all__ = ["AutoscaleConfig", "ScheduledBounds", "autoscale_doc", "parse_autoscale"]
