"""The queue settings of the config: the top-level ``queue:`` defaults and the backend URL."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ConfigError, parse_config


def _cfg(**top: Any) -> dict[str, Any]:
    return {
        "services": [
            {"name": "a", "processor": "queue"},
            {"name": "b", "processor": "queue", "queue": {"backend": "sqlite", "max_length": 7}},
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
        ({"queue": {"bakend": "sqlite"}}, "queue: unknown key(s) bakend"),
        ({"queue": ["redis://x"]}, "queue: expected a mapping"),
    ],
)
def test_bad_queue_settings_name_the_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_cfg(**raw))
    assert message in str(info.value)
