"""A python processor whose start is slow once a marker file exists (``config.slow_file``):
a worker restarted after that stays in ``starting`` for ``config.start_s`` seconds, long enough
to be seen. Answers ``ok``."""

from __future__ import annotations

import os
import time
from typing import Any


class SlowStart:
    config: dict[str, Any] = {}
    model_path: str | None = None

    def initialize(self) -> None:
        if os.path.exists(self.config["slow_file"]):
            time.sleep(float(self.config.get("start_s", 4.0)))

    def process(self, data: bytes) -> bytes:
        return b"ok"
