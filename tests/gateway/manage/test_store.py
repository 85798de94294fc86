"""The admin API's store: an overlay on the config file's services, kept across restarts."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from gateway.config import ConfigError, ServiceConfig
from gateway.manage.spec import parse_spec, spec_of
from gateway.manage.store import FILE_NAME, ManagedStore
from tests.e2e.gateway_proc import ECHO_ENTRY


def _svc(name: str, **kw: object) -> ServiceConfig:
    spec = {"name": name, "processor": "python", "entry": ECHO_ENTRY, **kw}
    if "token" not in kw:
        spec["public"] = True
    return parse_spec(spec)


def test_the_overlay_replaces_hides_and_adds_by_name(tmp_path: Path) -> None:
    store = ManagedStore(str(tmp_path))
    a, b, c = _svc("a"), _svc("b"), _svc("c")
    store.put(_svc("a", workers=3))
    store.delete("b")
    store.put(_svc("d"))
    merged = store.apply((a, b, c))
    assert [(s.name, s.workers) for s in merged] == [("a", 3), ("c", 1), ("d", 1)]


def test_it_survives_a_restart_and_keeps_secrets_private(tmp_path: Path) -> None:
    store = ManagedStore(str(tmp_path))
    svc = _svc("a", token="t0ken-1234567890", env={"SET": "v", "PASSED": None}, workers=2)
    store.put(svc)
    store.delete("gone")
    path = tmp_path / FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert doc["services"]["gone"] is None
    again = ManagedStore(str(tmp_path))
    again.load()
    assert again.overlay == {"a": svc, "gone": None}


def test_a_stale_entry_is_left_out_not_fatal(tmp_path: Path) -> None:
    doc = {
        "version": 1,
        "services": {"old": {"name": "old", "processor": "onnx", "public": True, "model": "/no/such.onnx"}},
    }
    (tmp_path / FILE_NAME).write_text(json.dumps(doc))
    store = ManagedStore(str(tmp_path))
    store.load()
    assert store.overlay == {}


def test_a_description_shows_no_secret() -> None:
    env = {"KEY": "secret", "PASSED": None}
    svc = _svc("a", token="t0ken-1234567890", tokens=["next-token-0987"], env=env)
    shown = spec_of(svc)
    assert shown["token"] == "***" and shown["tokens"] == ["***"]
    assert shown["env"] == {"KEY": "***", "PASSED": None}
    assert "t0ken" not in json.dumps(shown) and "secret" not in json.dumps(shown)
    assert parse_spec(spec_of(svc, redact=False)) == svc


def test_a_versioned_service_round_trips(tmp_path: Path) -> None:
    for name in ("a.onnx", "b.onnx"):
        (tmp_path / name).write_bytes(b"")
    versions = {1: str(tmp_path / "a.onnx"), 2: str(tmp_path / "b.onnx")}
    raw = {"name": "v", "processor": "onnx", "public": True, "versions": versions}
    svc = parse_spec(raw)
    assert svc.model == str(tmp_path / "b.onnx")
    assert spec_of(svc) == raw
    assert parse_spec(json.loads(json.dumps(spec_of(svc, redact=False)))) == svc


def test_what_the_config_file_manages_is_refused() -> None:
    for raw in (
        {"name": "q", "processor": "queue", "public": True, "workers": 0},
        {"name": "a", "processor": "python", "public": True, "entry": ECHO_ENTRY, "async": True},
    ):
        with pytest.raises(ConfigError, match="are configured in the file"):
            parse_spec(raw)
