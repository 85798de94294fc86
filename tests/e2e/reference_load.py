"""Continuous calls from the real eas-prediction client, in its own process, while a test
changes the gateway (scale, roll, reload): ``start`` returns once calls succeed, ``finish``
stops them and returns ``{"ok", "failed", "seconds"}``."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.eas_reference import reference_python

LOAD = r"""
import json, os, sys, threading, time
from eas_prediction import PredictClient, TFRequest
endpoint, service, marker, stop, token = sys.argv[1:6]
counts = {"ok": 0}
failed = []
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
        if counts["ok"] == 50:
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
        self.marker.unlink(missing_ok=True)
        self.stop.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [reference_python(), "-c", LOAD, endpoint, service, str(self.marker), str(self.stop), token],
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

    def finish(self) -> dict[str, Any]:
        self.stop.touch()
        out, err = self.proc.communicate(timeout=60)
        if self.proc.returncode != 0:
            raise AssertionError(f"reference load failed: {err[-2000:]}")
        result: dict[str, Any] = json.loads(out)
        result["rate"] = result["ok"] / max(result["seconds"], 1e-9)
        return result
