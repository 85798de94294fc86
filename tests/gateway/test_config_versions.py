"""Model versions in the service configuration: ``versions: {1: a.onnx, 2: b.onnx}`` and the
services (one worker pool each) they expand into."""

from __future__ import annotations

from pathlib import Path

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
        ({1: "a"}, {"processor": "python", "entry": "x.py:C"}, "only a model service"),
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
