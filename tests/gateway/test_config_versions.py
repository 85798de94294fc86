"""Model versions in the service configuration: ``versions: {1: a.onnx, 2: b.onnx}`` and the
services (one worker pool each) they expand into."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gateway.app import older_versions
from gateway.config import ConfigError, parse_config
from gateway.config.versions import version_key, version_services


def test_versions_expand_into_one_service_per_version(tmp_path: Path) -> None:
    files = {v: tmp_path / f"v{v}.onnx" for v in (1, 2, 10)}
    for f in files.values():
        f.write_bytes(b"onnx")
    versions = {10: str(files[10]), "2": str(files[2]), 1: str(files[1])}
    cfg = parse_config(
        {"services": [{"name": "m", "processor": "onnx", "token": "t", "workers": 2, "versions": versions}]}
    )
    (svc,) = cfg.services
    assert svc.version_names == ("1", "2", "10")  # by number, the latest last
    assert svc.model == str(files[10])
    served = version_services(svc)
    assert served["10"] is svc
    assert served["1"].name == version_key("m", "1") == "m@1" and served["1"].model == str(files[1])
    assert served["2"].tokens == ("t",) and served["2"].workers == 2 and not served["2"].versions
    assert [s.name for s in older_versions(cfg)] == ["m@1", "m@2"]
    # Without versions: one version, "1", the service itself.
    plain = parse_config(
        {"services": [{"name": "p", "processor": "onnx", "model": str(files[1]), "public": True}]}
    ).services[0]
    assert plain.version_names == ("1",) and version_services(plain) == {"1": plain}


@pytest.mark.parametrize(
    ("versions", "extra", "message"),
    [
        ({0: "a"}, {}, "must be >= 1"),
        ({"x": "a"}, {}, "expected an integer"),
        ({1: "missing.onnx"}, {}, "file not found"),
        ([], {}, "expected a mapping"),
        ({1: "a"}, {"model": "a"}, "either model or versions"),
        ({1: "a"}, {"processor": "queue"}, "only a model service or user code"),
    ],
)
def test_bad_versions_name_the_problem(tmp_path: Path, versions: object, extra: dict, message: str) -> None:
    (tmp_path / "a").write_bytes(b"onnx")
    raw = {"name": "m", "processor": "onnx", "versions": versions, "public": True, **extra}
    raw = {k: (str(tmp_path / v) if k == "model" else v) for k, v in raw.items()}
    if isinstance(versions, dict):
        raw["versions"] = {k: str(tmp_path / v) for k, v in versions.items()}
    with pytest.raises(ConfigError, match=message):
        parse_config({"services": [raw]})


def _versioned(tmp_path: Path, traffic: Any, numbers: tuple[int, ...] = (1, 2)) -> dict[str, Any]:
    versions = {}
    for n in numbers:
        (tmp_path / f"v{n}.onnx").write_bytes(b"onnx")
        versions[n] = str(tmp_path / f"v{n}.onnx")
    svc = {"name": "m", "processor": "onnx", "public": True, "versions": versions, "traffic": traffic}
    return {"services": [svc]}


@pytest.mark.parametrize(
    ("traffic", "message"),
    [
        ({1: 90, 2: 20}, "services[0] (m).traffic: the percents add up to 110, not 100"),
        ({1: 90, 3: 10}, "services[0] (m).traffic: version '3' is not one the service serves (1, 2)"),
        ({1: 90.5, 2: 9.5}, "services[0] (m).traffic.1: expected a whole percent from 0 to 100, got 90.5"),
        ([90, 10], "services[0] (m).traffic: expected a mapping of versions to percents"),
    ],
)
def test_a_bad_traffic_split_is_a_config_error_naming_the_key(
    tmp_path: Path, traffic: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(_versioned(tmp_path, traffic))


def test_traffic_needs_versions(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"onnx")
    svc = {
        "name": "m",
        "processor": "onnx",
        "public": True,
        "model": str(tmp_path / "m.onnx"),
        "traffic": {1: 100},
    }
    with pytest.raises(
        ConfigError, match=re.escape("services[0] (m).traffic: the service serves one version")
    ):
        parse_config({"services": [svc]})


def test_a_split_is_kept_in_version_order_and_older_versions_carry_none(tmp_path: Path) -> None:
    svc = parse_config(_versioned(tmp_path, {10: 5, 1: 95}, (1, 2, 10))).services[0]
    assert svc.traffic == (("1", 95), ("10", 5))
    assert all(s.traffic == () for s in version_services(svc).values() if s is not svc)
