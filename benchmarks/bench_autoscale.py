"""Autoscaling under a load step, and a cold start from zero workers.

One gateway, two services of a Python processor that computes 20 ms per call (a sleep, so
the two cores of a small machine are not what limits the pool):

  * ``step``: ``autoscale: {min_workers: 1, max_workers: 4, target: 4, scale_down_after_s: 5}``.
    ``--clients`` threads call it back to back for ``--seconds``; reported: the seconds from
    the first call until the pool has ``max_workers`` ready workers, the seconds from the
    last call until it is back at one, and the calls that did not answer 200 (goal: 0, and
    the target reached within 10 s).
  * ``cold``: ``min_workers: 0``, idle for 1 s: once it has no worker, one call; reported: its
    latency and the ``Server-Timing: cold-start`` the gateway answered with.

Usage: python benchmarks/bench_autoscale.py [--clients N] [--seconds S] [--quick]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import serve

PROCESSOR = """
import time


class Work:
    config = {}

    def initialize(self):
        pass

    def process(self, data):
        time.sleep(0.02)
        return data, 200
"""


def _workers(endpoint: str, service: str) -> list[dict[str, Any]]:
    conn = http.client.HTTPConnection(endpoint, timeout=10)
    try:
        conn.request("GET", "/api/services")
        doc = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return next(s for s in doc["services"] if s["name"] == service).get("workers", [])


def _ready(endpoint: str, service: str) -> int:
    return sum(1 for w in _workers(endpoint, service) if w["state"] == "ready")


def _until(what: str, check: Any, timeout: float = 120.0) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--quick", action="store_true", help="a shorter load step (8 s)")
    args = ap.parse_args()
    if args.quick:
        args.seconds = min(args.seconds, 8.0)
    with tempfile.TemporaryDirectory(prefix="easkit-bench-autoscale-") as tmp:
        folder = Path(tmp)
        (folder / "work.py").write_text(PROCESSOR)
        entry = f"{folder / 'work.py'}:Work"
        services = [
            {"name": "step", "processor": "python", "public": True, "entry": entry, "timeout_ms": 30000,
             "autoscale": {"min_workers": 1, "max_workers": 4, "target": 4, "scale_down_after_s": 5}},
            {"name": "cold", "processor": "python", "public": True, "entry": entry, "timeout_ms": 30000,
             "autoscale": {"min_workers": 0, "max_workers": 1, "idle_after_s": 1, "scale_down_after_s": 0}},
        ]  # fmt: skip
        gateway, endpoint = serve(folder, {"data_dir": str(folder / "data")}, services, dict(os.environ))
        try:
            _until("step's first worker", lambda: _ready(endpoint, "step") == 1)
            stop = threading.Event()
            counts = {"ok": 0, "failed": 0}
            lock = threading.Lock()

            def client() -> None:
                conn = http.client.HTTPConnection(endpoint, timeout=60)
                while not stop.is_set():
                    conn.request("POST", "/api/predict/step", body=b"x")
                    resp = conn.getresponse()
                    resp.read()
                    with lock:
                        counts["ok" if resp.status == 200 else "failed"] += 1
                conn.close()

            threads = [threading.Thread(target=client) for _ in range(args.clients)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            up = _until("four ready workers", lambda: _ready(endpoint, "step") == 4)
            time.sleep(max(0.0, args.seconds - (time.monotonic() - t0)))
            stop.set()
            for t in threads:
                t.join()
            down = _until("back to one worker", lambda: len(_workers(endpoint, "step")) == 1)
            print(f"load step, {args.clients} clients: 1 -> 4 ready workers in {up:.1f} s; "
                  f"back to 1 worker {down:.1f} s after the load (scale_down_after_s 5); "
                  f"{counts['ok']} calls answered 200, {counts['failed']} not")  # fmt: skip

            _until("cold scaled to zero", lambda: not _workers(endpoint, "cold"))
            conn = http.client.HTTPConnection(endpoint, timeout=60)
            t1 = time.monotonic()
            conn.request("POST", "/api/predict/cold", body=b"x")
            resp = conn.getresponse()
            resp.read()
            took = time.monotonic() - t1
            print(f"cold start: status {resp.status} in {took:.2f} s, "
                  f"Server-Timing: {resp.getheader('Server-Timing')}")  # fmt: skip
            conn.close()
            ok = counts["failed"] == 0 and up <= 10 and resp.status == 200
            print(
                f"goal (no failed call, target within 10 s, cold call answered): {'met' if ok else 'MISSED'}"
            )
            return 0 if ok else 1
        finally:
            gateway.stop()


if __name__ == "__main__":
    raise SystemExit(main())
