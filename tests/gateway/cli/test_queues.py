"""``eas-gateway queues``: options and the groups table (the calls themselves run against a
real gateway in tests/gateway/manage/test_queues_api.py)."""

from __future__ import annotations

import pytest

from gateway.cli import _parser, main
from gateway.cli.queues import groups_table


@pytest.mark.parametrize(
    "argv",
    [
        ["queues", "--admin", "http://h:1", "--token", "T", "groups", "jobs"],
        ["queues", "groups", "jobs", "--admin", "http://h:1", "--token", "T"],
    ],
)
def test_admin_and_token_are_kept_wherever_they_are_given(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    assert (args.admin, args.token, args.op, args.service) == ("http://h:1", "T", "groups", "jobs")


def test_delete_group_names_the_queue_when_asked() -> None:
    args = _parser().parse_args(["queues", "delete-group", "svc", "g1", "--queue", "sink"])
    assert (args.service, args.group, args.queue) == ("svc", "g1", "sink")


def test_groups_table_lines_up_every_queue_of_the_service() -> None:
    group = {
        "cursor": 7,
        "pending": 1,
        "lag": 3,
        "consumers": 2,
        "idle_s": 0.0,
        "last_seen": "2026-01-01T00:00:00Z",
    }
    doc = {"queues": {"svc": [{"group": "eas", **group}], "svc/sink": [{"group": "results", **group}]}}
    lines = groups_table(doc).splitlines()
    assert lines[0].split() == [
        "QUEUE",
        "GROUP",
        "CURSOR",
        "PENDING",
        "LAG",
        "CONSUMERS",
        "IDLE",
        "S",
        "LAST",
        "SEEN",
    ]
    assert lines[1].split() == ["svc", "eas", "7", "1", "3", "2", "0", "2026-01-01T00:00:00Z"]
    assert lines[2].split()[:2] == ["svc/sink", "results"]


def test_an_unreachable_admin_api_is_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queues", "groups", "jobs", "--admin", "http://127.0.0.1:9"]) == 1
    assert "cannot reach the admin API at http://127.0.0.1:9" in capsys.readouterr().err
