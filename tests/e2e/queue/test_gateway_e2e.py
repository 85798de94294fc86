"""The queue through the real gateway process (``python -m gateway serve``): the SDK, the
reference client, the service listing and /metrics, and a SIGKILL of the gateway."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest

from eas_sdk.queue import QueueClient
from tests.e2e.gateway_proc import GatewayProcess
from tests.eas_reference import run_reference

from .server_proc import TOKEN
from .test_demo import REFERENCE_DEMO

CONFIG: dict[str, Any] = {
    "gateway": {"access_log": False},
    "services": [{"name": "jobs", "processor": "queue", "token": TOKEN, "queue": {"heartbeat_s": 1.0}}],
}


@pytest.fixture
def gateway(tmp_path: Path) -> Any:
    proc = GatewayProcess.start(CONFIG, tmp_path / "gw")
    yield proc
    proc.kill()


def client(gw: GatewayProcess, uid: str | None = None) -> QueueClient:
    q = QueueClient(gw.endpoint, "jobs")
    q.set_token(TOKEN)
    q.init(uid=uid)
    return q


@pytest.mark.compat
def test_reference_client_through_gateway(gateway: GatewayProcess) -> None:
    proc = run_reference(REFERENCE_DEMO, gateway.endpoint, "jobs", TOKEN, timeout=90)
    assert b'"ok": true' in proc.stdout


def test_sdk_figures_and_restart(gateway: GatewayProcess, tmp_path: Path) -> None:
    q, w = client(gateway), client(gateway, uid="w1")
    ids = {q.put(f"{i}")[1] for i in range(30)}
    got: set[str] = set()
    watcher = w.watch(0, 4)
    frames = watcher.run()  # kept referenced: the connection stays open while we look
    for df in frames:
        got.add(df.tags["requestId"])
        if len(got) <= 26:
            w.commit(df.index)
        if len(got) == 30:
            break
    # 4 records outstanding at w1 while it is connected: the listing and /metrics show them.
    figures = gateway.services()["jobs"]["queues"]["jobs"]
    assert (figures["length"], figures["pending"], figures["consumers"]) == (4, 4, 1), figures
    with urllib.request.urlopen(gateway.url + "/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert 'easgw_queue_length{queue="jobs"} 4.0' in metrics
    assert 'easgw_queue_consumers{queue="jobs"} 1.0' in metrics
    assert 'easgw_queue_pending{queue="jobs"} 4.0' in metrics
    watcher.close()
    frames.close()
    assert got == ids
    # SIGKILL and restart on the same data dir: the 4 uncommitted records are still there.
    gateway.kill()
    again = GatewayProcess.start(CONFIG, tmp_path / "gw")
    try:
        q2 = client(again)
        assert q2.attributes()["stream.length"] == "4"
        idx, _ = q2.put(b"next")
        assert int(idx) > 30
        q2.close()
    finally:
        again.kill()
    q.close()
    w.close()
