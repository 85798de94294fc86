"""The autoscaler's decisions, on a clock the test moves (gateway.manage.autoscale), and the
``autoscale:`` settings (gateway.config.autoscale): up at once, down after the window, to
zero only after the idle period, the scheduled bounds, and each bad setting refused by name.
The gateway running it, with real workers, is tests/e2e/test_autoscale_e2e.py."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import generate_latest

from gateway.config import Config, ConfigError, GatewayConfig, ServiceConfig, parse_config
from gateway.config.autoscale import AutoscaleConfig, ScheduledBounds, parse_autoscale
from gateway.manage.autoscale import Autoscaler
from gateway.manage.manager import ServiceManager
from gateway.manage.spec import parse_spec, spec_of
from tests.gateway.doubles import BackendDouble
from tests.gateway.parts import gateway_parts

NOON = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)  # a Monday


@dataclass(eq=False)
class Loaded(BackendDouble):
    service: ServiceConfig = field(default_factory=lambda: ServiceConfig(name="m", processor="python"))
    pending: int = 0


def _scaler(auto: AutoscaleConfig) -> tuple[Autoscaler, ServiceConfig, Loaded]:
    svc = ServiceConfig(name="m", processor="python", autoscale=auto)
    backend = Loaded(service=svc)
    parts = gateway_parts(Config(gateway=GatewayConfig(), services=(svc,)), {"m": backend})
    parts.manager = ServiceManager(parts, lambda s, g: backend)
    return Autoscaler(parts.manager), svc, backend


def test_up_at_once_down_after_the_window_within_the_bounds() -> None:
    scaler, svc, backend = _scaler(
        AutoscaleConfig(min_workers=1, max_workers=3, target=2, scale_down_after_s=10)
    )
    assert scaler.decide(svc, backend, 0.0, NOON) == 1
    backend.pending = 5
    assert scaler.decide(svc, backend, 1.0, NOON) == 3  # ceil(5 / 2)
    backend.pending = 100
    assert scaler.decide(svc, backend, 2.0, NOON) == 3  # never past max_workers
    backend.pending = 0
    assert scaler.decide(svc, backend, 11.0, NOON) == 3  # the window still remembers the load
    assert scaler.decide(svc, backend, 12.5, NOON) == 1  # never below min_workers


async def test_to_zero_only_after_the_idle_period_and_the_gauge_says_so() -> None:
    auto = AutoscaleConfig(min_workers=0, max_workers=2, target=4, scale_down_after_s=0, idle_after_s=30)
    scaler, svc, backend = _scaler(auto)
    assert scaler.decide(svc, backend, 0.0, NOON) == 1
    backend.pending = 1
    assert scaler.decide(svc, backend, 5.0, NOON) == 1
    backend.pending = 0
    assert scaler.decide(svc, backend, 34.0, NOON) == 1
    assert scaler.decide(svc, backend, 35.5, NOON) == 0
    backend.ready = False  # a worker starting is not idleness
    assert scaler.decide(svc, backend, 100.0, NOON) == 1
    scaler.tick()  # the double has no workers to scale: the step is refused and logged
    await scaler.stop()
    text = generate_latest(scaler.manager.gw.metrics.registry).decode()
    assert 'easgw_desired_workers{service="m"} 1.0' in text


def test_the_schedule_entry_that_fired_last_sets_the_bounds() -> None:
    auto = AutoscaleConfig(
        min_workers=1,
        max_workers=8,
        schedule=(
            ScheduledBounds("0 8 * * 1-5", min_workers=4),
            ScheduledBounds("0 19 * * *", min_workers=2),
        ),
    )
    assert auto.bounds_at(NOON) == (4, 8)  # weekday 08:00 fired last
    assert auto.bounds_at(NOON.replace(hour=20)) == (2, 8)
    assert auto.bounds_at(NOON.replace(day=1)) == (2, 8)  # Sunday: the evening entry of Saturday
    scaler, svc, backend = _scaler(auto)
    assert scaler.decide(svc, backend, 0.0, NOON) == 4


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"min_workers": 3, "max_workers": 2}, "autoscale.min_workers"),
        ({"target": 0}, "autoscale.target"),
        ({"target": -1.5}, "autoscale.target"),
        ({"schedule": [{"cron": "every day", "min_workers": 1}]}, "autoscale.schedule[0].cron"),
        ({"schedule": [{"cron": "0 8 * * *"}]}, "autoscale.schedule[0]"),
        ({"schedule": [{"cron": "0 8 * * *", "min_workers": 9}]}, "autoscale.schedule[0].min_workers"),
        ({"min_worker": 1}, "autoscale: unknown key 'min_worker'"),
    ],
)
def test_a_bad_setting_is_a_config_error_naming_its_key(raw: dict[str, Any], key: str) -> None:
    config = {"services": [{"name": "m", "processor": "queue", "public": True}]}
    with pytest.raises(
        ConfigError, match=r"services\[0\] \(m\)\." + key.replace("[", r"\[").replace("]", r"\]")
    ):
        parse_config({"services": [{**config["services"][0], "processor": "onnx", "autoscale": raw,
                                    "model": "samples/models/digits.onnx"}]})  # fmt: skip
    assert parse_autoscale(None, "x") is None


def test_only_worker_processes_scale() -> None:
    with pytest.raises(ConfigError, match=r"autoscale: only a service run by worker processes"):
        parse_config({"services": [{"name": "q", "processor": "queue", "public": True, "autoscale": {}}]})


def test_the_settings_round_trip_through_the_admin_apis_description() -> None:
    raw = {
        "name": "m", "processor": "onnx", "public": True, "model": "samples/models/digits.onnx",
        "autoscale": {"min_workers": 0, "max_workers": 5, "target": 3, "idle_after_s": 30,
                      "schedule": [{"cron": "0 8 * * 1-5", "min_workers": 2},
                                   {"cron": "0 20 * * *", "max_workers": 2}]},
    }  # fmt: skip
    svc = parse_spec(raw)
    assert spec_of(svc)["autoscale"] == {**raw["autoscale"], "target": 3.0, "idle_after_s": 30.0}
    assert parse_spec(spec_of(svc)) == svc
