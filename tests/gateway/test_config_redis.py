"""The config's Redis settings: the top-level ``queue:`` defaults, the queue backend URL, and a
service's ``cluster_serving:`` stream."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ConfigError, parse_config


def _cfg(**top: Any) -> dict[str, Any]:
    return {
        "services": [
            {"name": "a", "processor": "queue", "public": True},
            {
                "name": "b",
                "processor": "queue",
                "public": True,
                "queue": {"backend": "sqlite", "max_length": 7},
            },
        ],
        **top,
    }


def test_default_backend_is_the_embedded_store() -> None:
    cfg = parse_config(_cfg())
    assert [s.queue.backend for s in cfg.services] == ["sqlite", "sqlite"]


def test_top_level_queue_is_every_service_default_and_a_service_overrides_it() -> None:
    cfg = parse_config(_cfg(queue={"backend": "redis://127.0.0.1:6379/2", "max_length": 50}))
    a, b = cfg.services
    assert (a.queue.backend, a.queue.max_length) == ("redis://127.0.0.1:6379/2", 50)
    assert (b.queue.backend, b.queue.max_length) == ("sqlite", 7)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"queue": {"backend": "postgres://x"}}, "services[0] (a).queue.backend: expected 'sqlite' or"),
        ({"queue": {"bakend": "sqlite"}}, "queue: unknown key 'bakend'; did you mean 'backend'?"),
        ({"queue": ["redis://x"]}, "queue: expected a mapping"),
    ],
)
def test_bad_queue_settings_name_the_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_cfg(**raw))
    assert message in str(info.value)


def test_async_services_may_keep_their_queues_in_redis() -> None:
    raw = {
        "services": [
            {"name": "a", "processor": "python", "entry": "pkg.mod:Cls", "async": True, "public": True}
        ]
    }
    raw["queue"] = {"backend": "redis://127.0.0.1:6379/0"}
    assert parse_config(raw).services[0].queue.backend == "redis://127.0.0.1:6379/0"


def _cs(**cs: Any) -> dict[str, Any]:
    return {
        "services": [
            {
                "name": "m",
                "processor": "python",
                "entry": "pkg.mod:Cls",
                "cluster_serving": cs,
                "public": True,
            }
        ]
    }


def test_cluster_serving_stream_settings() -> None:
    [svc] = parse_config(_cs(redis="redis://127.0.0.1:6379/0")).services
    assert svc.cluster_serving is not None
    assert (svc.cluster_serving.stream, svc.cluster_serving.group) == ("serving_stream", "serving")
    [plain] = parse_config(_cfg()).services[:1]
    assert plain.cluster_serving is None


@pytest.mark.parametrize(
    ("cs", "message"),
    [
        ({}, "cluster_serving.redis: expected a Redis URL"),
        ({"redis": "redis://h:1/0", "max_batch": 0}, "cluster_serving.max_batch: must be at least 1"),
        ({"redis": "redis://h:1/0", "strem": "x"}, "unknown key"),
    ],
)
def test_bad_cluster_serving_settings_name_the_field(cs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(_cs(**cs))


def test_a_gateway_listening_everywhere_names_where_other_gateways_reach_it() -> None:
    raw = _cfg(queue={"backend": "redis://127.0.0.1:6379/0"}, gateway={"host": "0.0.0.0"})
    with pytest.raises(ConfigError, match=r"gateway\.advertise_host: required"):
        parse_config(raw)
    raw["gateway"]["advertise_host"] = "10.0.0.7"
    assert parse_config(raw).gateway.advertise_host == "10.0.0.7"
