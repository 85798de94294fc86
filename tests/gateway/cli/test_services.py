"""``eas-gateway services`` and ``status``: options, service files and tables (the calls
themselves run against a real gateway in tests/e2e/test_services_e2e.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from gateway.cli import _parser
from gateway.cli.services import read_services
from gateway.cli.status_text import render


@pytest.mark.parametrize(
    "argv",
    [
        ["services", "--admin", "http://h:1", "--token", "T", "list"],
        ["services", "list", "--admin", "http://h:1", "--token", "T"],
        ["services", "--admin", "http://h:1", "list", "--token", "T"],
    ],
)
def test_admin_and_token_are_kept_wherever_they_are_given(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    assert (args.admin, args.token) == ("http://h:1", "T")


def test_service_files_resolve_relative_paths_against_their_folder(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    (tmp_path / "proc.py").write_text("")
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump({"name": "a", "processor": "onnx", "model": "m.onnx"}))
    assert read_services(str(one)) == [{"name": "a", "processor": "onnx", "model": str(tmp_path / "m.onnx")}]
    several = tmp_path / "several.json"
    entries = [
        {"name": "b", "processor": "python", "entry": "proc.py:P"},
        {"name": "c", "processor": "python", "entry": "package.module:P"},
        {"name": "d", "processor": "onnx", "model": "absent.onnx"},
    ]
    several.write_text(json.dumps({"services": entries}))
    got = read_services(str(several))
    assert [s.get("entry") or s.get("model") for s in got] == [
        f"{tmp_path / 'proc.py'}:P",
        "package.module:P",
        "absent.onnx",  # left for the gateway to refuse, naming the path it was given
    ]


def _snapshot(**extra: object) -> dict[str, object]:
    svc = {"name": "d", "processor": "onnx", "async": False, "ready": False, "requests_total": 300,
           "errors_total": 3, "rate_rps": 40.0, "error_rate": 0.01, "p50_ms": 1.5, "p99_ms": 9.25,
           "restarts": 1, **extra}  # fmt: skip
    svc["workers"] = [{"id": 0, "pid": 9, "state": "starting", "outstanding": 0, "restarts": 1}]
    return {"gateway": {"version": "1.0"}, "uptime_s": 12.0, "window_s": 5.0, "shutting_down": False,
            "services": [svc]}  # fmt: skip


def test_status_prints_one_table_from_the_main_port_or_the_admin_api() -> None:
    error = {"at": 1767225600.0, "status": 503, "message": "service 'd' is not ready"}
    main_port = render(_snapshot(reason="its workers failed to start: InvalidProtobuf", last_error=error))
    admin = _snapshot(reason="its workers failed to start: InvalidProtobuf", last_error=error, in_flight=0)
    admin["gateway"] = {"version": "1.0", "pid": 7}  # what the admin API adds
    assert render(admin) == main_port
    lines = main_port.splitlines()
    assert lines[0] == "gateway 1.0, up 12 s; rates over the last 5 s"
    assert lines[3].split() == ["d", "onnx", "NO", "40.0", "1.50", "9.25", "1.0", "300", "1"]
    assert lines[4] == "    not ready: its workers failed to start: InvalidProtobuf"
    when = time.strftime("%H:%M:%S", time.localtime(error["at"]))
    assert lines[5] == f"    last error: 503 at {when}: service 'd' is not ready"
    assert lines[6] == "    worker 0: pid 9, starting, 0 in flight, 1 restarts"


def test_status_reads_the_main_port_unless_an_admin_api_is_named() -> None:
    assert _parser().parse_args(["status"]).url is None  # then http://127.0.0.1:8080
    args = _parser().parse_args(["status", "--admin", "http://h:1"])
    assert args.admin == "http://h:1"


def test_create_and_update_wait_unless_told_not_to() -> None:
    args = _parser().parse_args(["services", "create", "-f", "x.yaml"])
    assert args.no_wait is False
    assert _parser().parse_args(["services", "update", "-f", "x.yaml", "--no-wait"]).no_wait is True
