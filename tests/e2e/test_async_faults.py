"""kill -9 of a worker, and of the whole gateway, during an asynchronous run: no input is lost
and no result is doubled."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from eas_sdk import QueueClient

PROCESSORS = Path(__file__).resolve().parents[1] / "processors"  # python processors loaded by path
N = 400


def _config() -> dict[str, Any]:
    return {
        "services": [
            {
                "name": "slow",
                "processor": "python",
                "entry": f"{PROCESSORS / 'slow_echo.py'}:SlowEcho",
                "workers": 2,
                "async": True,
                "timeout_ms": 3000,
                "config": {"sleep_s": 0.005},
            }
        ]
    }


def _client(endpoint: str, name: str) -> QueueClient:
    q = QueueClient(endpoint, name)
    q.set_timeout(3000)
    q.init()
    return q


def _length(q: QueueClient) -> int:
    return int(q.attributes()["stream.length"])


def _wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _sink_records(endpoint: str) -> list[tuple[str, bytes]]:
    sink = _client(endpoint, "slow/sink")
    try:
        frames = sink.get(index=0, length=10_000, timeout="0s", auto_delete=False)
        return [(f.tags["requestId"], bytes(f.data)) for f in frames]
    finally:
        sink.close()


def _check_exactly_once(accepted: dict[str, bytes], records: list[tuple[str, bytes]]) -> None:
    rids = [rid for rid, _ in records]
    assert len(rids) == len(set(rids)), "a request id has two results in the sink"
    by_rid = dict(records)
    missing = [rid for rid in accepted if rid not in by_rid]
    assert not missing, f"{len(missing)} accepted inputs have no result"
    for rid, data in accepted.items():
        assert by_rid[rid] == b"done:" + data


def test_worker_killed_mid_run(gateway_factory: Any) -> None:
    gw = gateway_factory(_config())
    gw.wait_workers_ready("slow", 2)
    q = _client(gw.endpoint, "slow")
    sink = _client(gw.endpoint, "slow/sink")
    try:
        accepted = {}
        for i in range(N):
            data = f"w{i}".encode()
            accepted[q.put(data)[1]] = data
        _wait(lambda: _length(sink) >= N // 4, 20, "the first results")
        victim = gw.worker_pids("slow")[0]
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: _length(q) == 0 and _length(sink) >= N, 40, "every result")
        assert _length(sink) == N
        _check_exactly_once(accepted, _sink_records(gw.endpoint))
        # it was really replaced (the pool may notice an idle worker's death a health check later)
        _wait(lambda: victim not in gw.worker_pids("slow"), 15, "the killed worker to be replaced")
    finally:
        q.close()
        sink.close()


def test_gateway_killed_and_restarted_mid_run(gateway_factory: Any) -> None:
    gw = gateway_factory(_config(), name="gw")
    gw.wait_workers_ready("slow", 2)
    accepted: dict[str, bytes] = {}
    stop = threading.Event()

    def producer() -> None:
        q = _client(gw.endpoint, "slow")
        q.set_retry_count(0)
        i = 0
        try:
            while not stop.is_set() and i < 5 * N:
                data = f"g{i}".encode()
                try:
                    _idx, rid = q.put(data)
                except Exception:
                    return  # the gateway is gone: only what returned counts as accepted
                accepted[rid] = data
                i += 1
        finally:
            q.close()

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    sink = _client(gw.endpoint, "slow/sink")
    try:
        _wait(lambda: _length(sink) >= N // 4 and len(accepted) >= N, 30, "a run in progress")
    finally:
        sink.close()
    gw.kill()  # SIGKILL to the gateway's whole process group: workers die with it
    stop.set()
    t.join(10)
    assert not t.is_alive()
    gw2 = gateway_factory(_config(), name="gw")  # same data directory
    q = _client(gw2.endpoint, "slow")
    sink = _client(gw2.endpoint, "slow/sink")
    try:
        _wait(lambda: _length(q) == 0 and _length(sink) >= len(accepted), 40, "every result after restart")
        records = _sink_records(gw2.endpoint)
        _check_exactly_once(accepted, records)
        # One producer thread: at most the put in flight at the kill reached the disk unanswered.
        assert len(accepted) <= len(records) <= len(accepted) + 1
    finally:
        q.close()
        sink.close()
