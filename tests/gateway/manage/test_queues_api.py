"""Consumer groups through the real gateway: listed and deleted with the admin API and the
CLI (``eas-gateway queues ...``), kept across restarts, and an abandoned group that filled
its queue (429) deleted after ``group_idle_ttl_s`` so that puts are accepted again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from eas_sdk.errors import HTTPStatusError
from eas_sdk.queue import QueueClient
from tests.e2e.gateway_proc import ROOT, GatewayProcess
from tests.e2e.queue.server_proc import TOKEN

ADMIN_TOKEN = "admin-token-5be1f09c7d2a4e36"
CONFIG: dict[str, Any] = {
    "admin": {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN},
    "services": [
        {
            "name": "jobs",
            "processor": "queue",
            "token": TOKEN,
            "queue": {"max_length": 5, "group_idle_ttl_s": 1.5, "group_evict_idle_s": 0, "heartbeat_s": 1},
        },
        {
            "name": "evicting",
            "processor": "queue",
            "token": TOKEN,
            "queue": {"max_length": 3, "group_idle_ttl_s": 0, "group_evict_idle_s": 1.0},
        },
        {
            "name": "pinned",
            "processor": "queue",
            "token": TOKEN,
            "queue": {"max_length": 4, "group_idle_ttl_s": 0, "group_evict_idle_s": 0},
        },
    ],
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    proc = GatewayProcess.start(CONFIG, tmp_path_factory.mktemp("groups"))
    yield proc
    proc.kill()


def _admin_url(gw: GatewayProcess) -> str:
    found = re.findall(r"admin API listening on (http://\S+)", gw.output())
    assert found, gw.output()[-2000:]
    return str(found[-1])  # the log files are appended to across restarts


def _admin(gw: GatewayProcess, method: str, path: str, token: str = ADMIN_TOKEN) -> tuple[int, Any]:
    req = urllib.request.Request(
        _admin_url(gw) + path, method=method, headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"null")


def _cli(gw: GatewayProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EAS_ADMIN_URL": _admin_url(gw), "EAS_ADMIN_TOKEN": ADMIN_TOKEN}
    argv = [sys.executable, "-m", "gateway", "queues", *args]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)


def _client(gw: GatewayProcess, name: str, gid: str = "eas") -> QueueClient:
    q = QueueClient(gw.endpoint, name)
    q.set_token(TOKEN)
    q.set_retry_count(0)
    q.init(gid=gid)
    return q


def _abandon(gw: GatewayProcess, name: str, gid: str) -> None:
    """A record is put; a watcher of group ``gid`` receives it and goes away for good."""
    q = _client(gw, name, gid)
    q.put("first")
    watcher = q.watch(0, 1)
    assert next(watcher.run()).data == b"first"
    watcher.close()
    q.close()


def _groups(gw: GatewayProcess, name: str) -> list[dict[str, Any]]:
    status, doc = _admin(gw, "GET", f"/admin/services/{name}/groups")
    assert status == 200, doc
    return list(doc["queues"][name])


def _fill(q: QueueClient, n: int) -> None:
    for i in range(n):
        q.put(f"r{i}")
    with pytest.raises(HTTPStatusError) as info:
        q.put("one too many")
    assert info.value.code == 429


def test_an_abandoned_group_is_deleted_after_its_idle_ttl(gw: GatewayProcess) -> None:
    _abandon(gw, "jobs", "batch")
    q = _client(gw, "jobs")
    _fill(q, 4)  # every record is owed to group batch: the queue is full
    (batch,) = _groups(gw, "jobs")
    assert (batch["group"], batch["lag"], batch["consumers"]) == ("batch", 5, 0)
    deadline = time.monotonic() + 10
    while True:
        try:
            q.put("accepted again")
            break
        except HTTPStatusError as exc:
            assert exc.code == 429 and time.monotonic() < deadline
            time.sleep(0.1)
    assert _groups(gw, "jobs") == []
    assert q.attributes()["stream.length"] == "1"  # the abandoned group's records went with it
    assert gw.output().count("group batch deleted after") == 1
    q.close()


def test_a_full_queue_evicts_the_oldest_records_only_a_long_idle_group_needs(gw: GatewayProcess) -> None:
    _abandon(gw, "evicting", "away")
    q = _client(gw, "evicting")
    _fill(q, 2)  # at once: the group has been idle for less than group_evict_idle_s
    deadline = time.monotonic() + 10
    while True:
        try:
            index, _ = q.put("evicts the oldest")
            break
        except HTTPStatusError as exc:
            assert exc.code == 429 and time.monotonic() < deadline
            time.sleep(0.1)
    got = q.get(length=10, auto_delete=False, timeout="0s")
    assert [d.index for d in got] == [2, 3, int(index)]  # record 1 went; the group stays
    assert [g["group"] for g in _groups(gw, "evicting")] == ["away"]
    assert gw.output().count("queue evicting is full: evicted 1 record(s)") == 1
    q.close()


def test_groups_are_listed_and_deleted_through_the_api_and_the_cli(gw: GatewayProcess) -> None:
    _abandon(gw, "pinned", "old")
    q = _client(gw, "pinned")
    _fill(q, 3)
    q.close()
    out = _cli(gw, "groups", "pinned")
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split()[:6] == ["QUEUE", "GROUP", "CURSOR", "PENDING", "LAG", "CONSUMERS"]
    assert row.split()[:6] == ["pinned", "old", "2", "0", "4", "0"]  # record 1 went to the watcher

    assert _admin(gw, "DELETE", "/admin/services/pinned/groups/old", token="nope")[0] == 401
    status, doc = _admin(gw, "DELETE", "/admin/services/pinned/groups/nobody")
    assert (status, doc["code"]) == (404, "NotFound") and "nobody" in doc["message"]
    assert _admin(gw, "DELETE", "/admin/services/pinned/groups/old?queue=sink")[0] == 400
    live = _client(gw, "pinned", "old")
    watcher = live.watch(0, 1)
    frames = watcher.run()  # kept referenced: the connection stays open while we look
    assert next(frames).index == 1
    assert _groups(gw, "pinned")[0]["consumers"] == 1
    out = _cli(gw, "delete-group", "pinned", "old")
    assert out.returncode == 1 and "Conflict" in out.stderr and "connected consumer" in out.stderr
    watcher.close()
    frames.close()
    live.close()


def test_a_deleted_group_stays_deleted_after_a_restart(gw: GatewayProcess) -> None:
    workdir = gw.workdir
    assert gw.stop() == 0
    again = GatewayProcess.start(CONFIG, workdir)
    try:
        assert [g["group"] for g in _groups(again, "pinned")] == ["old"]  # groups are kept
        out = _cli(again, "delete-group", "pinned", "old")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "group old of queue pinned deleted (4 record(s) deleted with it)"
        again.kill()  # no clean stop: the deletion was journalled before the answer
        third = GatewayProcess.start(CONFIG, workdir)
        try:
            assert _groups(third, "pinned") == []
            q = _client(third, "pinned")
            assert q.attributes()["stream.length"] == "0"
            q.put("room again")
            q.close()
        finally:
            third.kill()
    finally:
        again.kill()
