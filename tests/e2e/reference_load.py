"""Continuous calls from the real eas-prediction client, in its own process, while a test
changes the gateway (scale, roll, reload): ``start`` returns once calls succeed,
``wait_calls`` once more have succeeded (calls after a change), ``finish`` stops them and
returns ``{"ok", "failed", "seconds"}``."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.eas_reference import reference_python
from tests.waiting import wait_until

LOAD = r"""
import json, os, sys, threading, time
from eas_prediction import PredictClient, TFRequest
endpoint, service, marker, stop, token, progress = sys.argv[1:7]
counts = {"ok": 0}
failed = []
def report(ok):
    # Every few calls, whole (written aside, then renamed): the test reads it while it runs.
    with open(progress + ".tmp", "w") as fh:
        fh.write(str(ok))
    os.replace(progress + ".tmp", progress)
def run():
    client = PredictClient(endpoint, service)
    if token:
        client.set_token(token)
    client.init()
    while not os.path.exists(stop):
        req = TFRequest("serving_default")
        req.add_feed("input", [1, 64], TFRequest.DT_FLOAT, [0.5] * 64)
        try:
            client.predict(req).get_values("label")
            counts["ok"] += 1
        except Exception as exc:
            failed.append(str(exc)[:200])
        ok = counts["ok"]
        if ok % 10 == 0:
            report(ok)
        if ok >= 50 and not os.path.exists(marker):  # >=: the other thread may have counted 50
            open(marker, "w").close()
    client.destroy()
t0 = time.time()
threads = [threading.Thread(target=run) for _ in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"ok": counts["ok"], "failed": failed, "seconds": time.time() - t0}))
"""


class ReferenceLoad:
    def __init__(self, endpoint: str, service: str, workdir: Path, token: str = "") -> None:
        self.marker = workdir / f"calling-{service}"
        self.stop = workdir / f"stop-{service}"
        self.progress = workdir / f"calls-{service}"
        for path in (self.marker, self.stop, self.progress):
            path.unlink(missing_ok=True)
        argv = [str(self.marker), str(self.stop), token, str(self.progress)]
        self.proc = subprocess.Popen(
            [reference_python(), "-c", LOAD, endpoint, service, *argv],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    @classmethod
    def start(cls, endpoint: str, service: str, workdir: Path, token: str = "") -> ReferenceLoad:
        load = cls(endpoint, service, workdir, token)
        deadline = time.monotonic() + 30
        while not load.marker.exists() and load.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not load.marker.exists():
            load.stop.touch()
            _, err = load.proc.communicate(timeout=30)
            raise AssertionError(f"the reference client never got going: {err[-2000:]}")
        return load

    def calls(self) -> int:
        """Calls answered so far (as last reported: every ten)."""
        try:
            return int(self.progress.read_text() or 0)
        except FileNotFoundError:
            return 0

    def wait_calls(self, more: int, timeout: float = 30.0) -> None:
        """Until ``more`` calls past those answered now have been answered: calls made after
        a change the test just made (a roll, a scale, a reload)."""
        target = self.calls() + more
        wait_until(
            lambda: self.calls() >= target or self.proc.poll() is not None, timeout, f"{more} more calls"
        )
        assert self.proc.poll() is None, "the reference load ended early"

    def rate(self, calls: int = 100) -> float:
        """Calls per second now, over the next ``calls`` (a baseline before a change)."""
        started = time.monotonic()
        self.wait_calls(calls)
        return calls / (time.monotonic() - started)

    def finish(self) -> dict[str, Any]:
        self.stop.touch()
        out, err = self.proc.communicate(timeout=60)
        if self.proc.returncode != 0:
            raise AssertionError(f"reference load failed: {err[-2000:]}")
        result: dict[str, Any] = json.loads(out)
        result["rate"] = result["ok"] / max(result["seconds"], 1e-9)
        return result
