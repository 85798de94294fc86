"""A python processor for fault tests: works a few milliseconds, answers ``done:<body>``."""

from __future__ import annotations

import time
from typing import Any


class SlowEcho:
    config: dict[str, Any] = {}
    model_path: str | None = None

    def initialize(self) -> None:
        return None

    def process(self, data: bytes) -> tuple[bytes, int]:
        time.sleep(float(self.config.get("sleep_s", 0.005)))
        return b"done:" + data, 200
