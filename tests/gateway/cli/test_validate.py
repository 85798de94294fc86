"""``eas-gateway validate``: every error of a file at once, each with its place; exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from tests.e2e.gateway_proc import ECHO_ENTRY


def test_every_error_is_listed_with_its_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {
        "gateway": {
            "port": "eighty",
            "log_format": "xml",
            "shutdown_timeout_s": -1,
            "worker_scheduling": "fifo",
        },
        "admin": {"host": "0.0.0.0", "port": 9000},
        "services": [
            {"name": "ok", "processor": "python", "public": True, "entry": ECHO_ENTRY},
            {
                "name": "digits",
                "processor": "onnx",
                "public": True,
                "model": "missing.onnx",
                "workers": 0,
                "colour": "red",
            },
            {"name": "bad name!", "processor": "tensorflow", "public": True, "timeout_ms": "soon"},
            {"name": "ok", "processor": "python", "public": True, "entry": ECHO_ENTRY},
        ],
    }
    path = tmp_path / "services.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert main(["validate", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    found = [line.removeprefix(f"{path}: ") for line in lines]
    expected = [
        "gateway.port: expected an integer, got 'eighty'",
        "gateway.shutdown_timeout_s: must be >= 0.0, got -1.0",
        "gateway.log_format: must be 'text' or 'json'",
        "gateway.worker_scheduling: must be 'batch' or 'normal'",
        "admin.token: required when the admin API listens on '0.0.0.0', not a loopback address",
        "services[1] (digits): unknown key(s) colour;",
        "services[1] (digits).model: file not found: ",
        "services[1] (digits).workers: must be >= 1, got 0",
        "services[2].name: 'bad name!' must match ",
        "services[2] (bad name!).processor: must be one of onnx, sklearn, xgboost, lightgbm, python, queue, "
        "pipeline, got 'tensorflow'",
        "services[2] (bad name!).timeout_ms: expected an integer, got 'soon'",
        "services: duplicate service name 'ok'",
        "12 error(s)",
    ]
    for want in expected:
        assert any(line.startswith(want) or want in line for line in found), (want, found)
    assert len(found) == 13, found


def test_a_good_file_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(
        yaml.safe_dump(
            {"services": [{"name": "echo", "processor": "python", "public": True, "entry": ECHO_ENTRY}]}
        )
    )
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: OK, 1 service(s): echo"


def test_a_file_that_is_not_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("services: [unclosed\n")
    assert main(["validate", str(path)]) == 1
    assert "is not valid YAML" in capsys.readouterr().err
