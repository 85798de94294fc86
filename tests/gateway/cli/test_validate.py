"""``eas-gateway validate``: every error of a file at once, each with its place; exit 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
            {"name": "bad name!", "processor": "pyhton", "public": True, "timeout_ms": "soon"},
            {"name": "ok", "processor": "python", "public": True, "entry": ECHO_ENTRY},
        ],
    }
    path = tmp_path / "services.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    colour = 1 + path.read_text().splitlines().index("  colour: red")
    assert main(["validate", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    found = [line.removeprefix(f"{path}: ") for line in lines]
    expected = [
        "gateway.port: expected an integer, got 'eighty'",
        "gateway.shutdown_timeout_s: must be >= 0.0, got -1.0",
        "gateway.log_format: must be 'text' or 'json'",
        "gateway.worker_scheduling: must be 'batch' or 'normal'",
        "admin.token: required when the admin API listens on '0.0.0.0', not a loopback address",
        f"services[1] (digits): unknown key 'colour' (line {colour}); allowed: ",
        "services[1] (digits).model: file not found: ",
        "services[1] (digits).workers: must be >= 1, got 0",
        "services[2].name: 'bad name!' must match ",
        "services[2] (bad name!).processor: must be one of onnx, ",
        "services[2] (bad name!).timeout_ms: expected an integer, got 'soon'",
        "services: duplicate service name 'ok'",
        "12 error(s)",
    ]
    for want in expected:
        assert any(line.startswith(want) or want in line for line in found), (want, found)
    assert any(line.endswith("got 'pyhton'") for line in found), found
    assert len(found) == 13, found


def test_a_misspelt_key_is_one_error_with_its_line_and_the_key_meant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "services.yaml"
    path.write_text(
        "gateway:\n"
        "  prot: 8080\n"
        "services:\n"
        "  - name: echo\n"
        "    procesor: python\n"
        f"    entry: {ECHO_ENTRY}\n"
        "    public: true\n"
        "    wokers: 2\n"
    )
    assert main(["validate", str(path)]) == 1
    found = [line.removeprefix(f"{path}: ") for line in capsys.readouterr().err.splitlines()]
    # The misspelt processor is read as the processor: no second error says it is missing.
    assert found == [
        "gateway: unknown key 'prot' (line 2); did you mean 'port'?",
        "services[0] (echo): unknown key 'procesor' (line 5); did you mean 'processor'?",
        "services[0] (echo): unknown key 'wokers' (line 8); did you mean 'workers'?",
        "3 error(s)",
    ]


def test_the_line_is_given_under_queue_defaults_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "services.yaml"
    path.write_text(
        "queue:\n  fsync: always\n"
        "services:\n  - name: q\n    processor: queue\n    public: true\n    wrkers: 0\n"
    )
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: services[0] (q): unknown key 'wrkers' (line 7); did you mean 'workers'?" in err, err


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (
            {"gateway": {"grpc_port": 8081}, "admin": {"port": 8081}},
            "gateway.grpc_port and admin.port are both 8081: each listener needs a port of its own",
        ),
        (
            {"gateway": {"port": 9000, "grpc_port": 9000}},
            "gateway.port and gateway.grpc_port are both 9000: each listener needs a port of its own",
        ),
        (
            {
                "gateway": {"host": "0.0.0.0", "port": 9000},
                "admin": {"host": "127.0.0.1", "port": 9000, "token": "t"},
            },
            "gateway.port and admin.port are both 9000: each listener needs a port of its own",
        ),
    ],
)
def test_two_listeners_on_one_port_are_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sections: dict[str, Any], message: str
) -> None:
    path = tmp_path / "services.yaml"
    path.write_text(yaml.safe_dump(sections))
    assert main(["validate", str(path)]) == 1
    assert capsys.readouterr().err.splitlines() == [f"{path}: {message}", f"{path}: 1 error(s)"]


def test_listeners_on_other_addresses_or_any_free_port_do_not_clash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "services.yaml"
    apart = {"gateway": {"port": 0, "grpc_port": 0}, "admin": {"host": "127.0.0.2", "port": 8080}}
    path.write_text(yaml.safe_dump(apart))
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err


def test_a_port_flag_that_clashes_is_named_as_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "services.yaml"
    path.write_text(yaml.safe_dump({"admin": {"port": 8081}}))
    assert main(["serve", "--config", str(path), "--port", "8081"]) == 2
    err = capsys.readouterr().err
    assert "--port (over gateway.port) and admin.port are both 8081" in err, err


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
