"""The reference servers the benchmarks run beside ours answer the SDK's calls correctly,
so a benchmark measures them doing what ours does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from eas_sdk.queue import QueueClient

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_queue_floor_server_answers_the_sdks_cycle() -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "queue_floor_server.py"), str(port)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the floor server did not start"
                time.sleep(0.05)
        q = QueueClient(f"127.0.0.1:{port}", "q")
        q.set_token("unchecked")
        q.init()
        first, rid = q.put(b"one")  # the index as a string, as eas-prediction returns it
        second, _ = q.put(b"two")
        got = q.get(index=first, timeout="0s", auto_delete=False)
        assert [(r.index, r.data, r.tags["requestId"]) for r in got] == [(int(first), b"one", rid)]
        q.commit([first])
        assert [r.data for r in q.get(index=second, timeout="0s")] == [b"two"]  # and deleted
        assert q.attributes()["stream.length"] == "0"
        q.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
