"""``eas-gateway services`` and ``status``: options, service files and tables (the calls
themselves run against a real gateway in tests/e2e/test_services_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gateway.cli import _parser
from gateway.cli.services import read_services, status_table


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


def test_status_rates_and_latency_come_from_two_samples() -> None:
    def sample(requests: int, latency: float) -> dict[str, object]:
        svc = {"name": "d", "ready": True, "workers": [{"state": "ready"}, {"state": "starting"}],
               "restarts": 1, "in_flight": 2, "requests": requests, "latency_sum_s": latency}  # fmt: skip
        return {"gateway": {"version": "1.0", "pid": 7}, "uptime_s": 12.0, "services": [svc]}

    table = status_table(sample(100, 1.0), sample(300, 1.5), 2.0).splitlines()
    assert table[0] == "eas-gateway 1.0 (pid 7), up 12 s"
    assert table[2].split() == ["d", "yes", "1/2", "1", "2", "100.0", "2.50"]
