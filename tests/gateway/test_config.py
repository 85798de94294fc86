"""Configuration traps: an open service must be declared, and YAML values that are not the
string that was meant are refused with a message saying how to quote them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config, open_service_warnings, parse_config


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "services.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


def _queue(**extra: object) -> dict[str, object]:
    return {"services": [{"name": "q", "processor": "queue", **extra}]}


@pytest.mark.parametrize(
    ("service", "fragment"),
    [
        ({}, "no token; give the service a token, or declare it open with 'public: true'"),
        ({"token": None}, "token: null; give the service a token"),
        ({"token": ""}, "token: empty"),
        ({"token": "t", "public": True}, "contradict"),
        ({"tokens": ["t"], "public": True}, "contradict"),
        ({"token": True}, "boolean"),
    ],
)
def test_tokens_missing_empty_null_and_public_are_distinguished(
    service: dict[str, object], fragment: str
) -> None:
    with pytest.raises(ConfigError, match="services\\[0\\] \\(q\\)") as info:
        parse_config(_queue(**service))
    assert fragment in str(info.value)


def test_open_services_are_declared() -> None:
    for service in ({"public": True}, {"public": True, "token": None}):
        (svc,) = parse_config(_queue(**service)).services
        assert svc.public and svc.tokens == ()
    (svc,) = parse_config(_queue(token="t", tokens=["u"])).services
    assert not svc.public and svc.tokens == ("t", "u")


@pytest.mark.parametrize(
    ("line", "fragment", "quoted"),
    [
        ("token: 0123456", "0-prefixed digits as octal", 'token: "0123456"'),
        ("token: 1234", "the number 1234", 'token: "1234"'),
        ("token: yes", "the boolean True", 'token: "yes"'),
        ("token: off", "the boolean False", 'token: "off"'),
        ("tokens: [no]", "tokens[0]: expected a string, got the boolean False", 'tokens: ["no"]'),
    ],
)
def test_yaml_surprises_say_how_to_quote(tmp_path: Path, line: str, fragment: str, quoted: str) -> None:
    head = "services:\n  - name: q\n    processor: queue\n    "
    with pytest.raises(ConfigError, match="quote the value") as info:
        _load(tmp_path, head + line + "\n")
    assert fragment in str(info.value)
    _load(tmp_path, head + quoted + "\n")  # quoted, it is the string that was meant


def test_gateway_strings_are_not_numbers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"gateway\.log_level: expected a string, got the boolean"):
        _load(tmp_path, "gateway:\n  log_level: off\n")


def test_public_service_on_a_non_loopback_address_warns() -> None:
    raw = {**_queue(public=True), "gateway": {"host": "0.0.0.0"}}
    (warning,) = open_service_warnings(parse_config(raw))
    assert "'q' is public" in warning and "0.0.0.0" in warning
    assert open_service_warnings(parse_config(_queue(public=True))) == []
    assert open_service_warnings(parse_config({**_queue(token="t"), "gateway": {"host": "0.0.0.0"}})) == []
