"""A python processor a test holds: its start waits until ``config.start_gate`` exists (when
given), and each call until ``config.release`` exists (when given), so a test decides when a
worker becomes ready and when calls end, never guessing a duration. Neither wait outlasts
``config.max_hold_s`` (a test that forgets to release fails by its calls, not by hanging).
Answers ``held:<body>``."""

from __future__ import annotations

import os
import time
from typing import Any


def _wait_for(path: str | None, limit: float) -> None:
    deadline = time.monotonic() + limit
    while path and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


class Held:
    config: dict[str, Any] = {}
    model_path: str | None = None

    def initialize(self) -> None:
        _wait_for(self.config.get("start_gate"), float(self.config.get("max_hold_s", 60)))

    def process(self, data: bytes) -> tuple[bytes, int]:
        _wait_for(self.config.get("release"), float(self.config.get("max_hold_s", 60)))
        return b"held:" + data, 200
