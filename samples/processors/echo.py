"""EchoProcessor: the smallest EAS-style custom processor (python processor sample).

It answers the request body unchanged. A few bodies change that, for tests and demos:

* ``raise`` or ``raise:<message>``: ``process`` raises ``ValueError(<message>)``; the
  gateway answers 400 with the message and the worker keeps serving.
* ``status:<code>[:<body>]``: answers ``<body>`` (default ``status <code>``) with that status.
* ``sleep:<seconds>``: sleeps, then answers ``slept <seconds>`` (timeout/cancel tests).
* ``config``: answers the service's ``config`` mapping as JSON.
* ``count``: answers how many times ``process`` ran in this worker process.
* ``pid``: answers the worker's process id.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


class EchoProcessor:
    # Set by the python processor loader before initialize().
    config: dict[str, Any] = {}
    model_path: str | None = None

    def __init__(self) -> None:
        self.runs = 0
        self.initialized = False

    def initialize(self) -> None:
        if self.config.get("initialize_sleep_s"):
            time.sleep(float(self.config["initialize_sleep_s"]))
        if self.config.get("fail_initialize"):
            raise RuntimeError("initialize failed on purpose (config.fail_initialize)")
        self.initialized = True

    def process(self, data: bytes) -> tuple[bytes | str, int] | bytes:
        self.runs += 1
        if data == b"raise" or data.startswith(b"raise:"):
            raise ValueError(data[6:].decode() or "echo was asked to raise")
        if data.startswith(b"status:"):
            _, code, *rest = data.split(b":", 2)
            body = rest[0] if rest else b"status " + code
            return body, int(code)
        if data.startswith(b"sleep:"):
            seconds = min(float(data[6:]), 30.0)
            time.sleep(seconds)
            return f"slept {seconds:g}", 0
        if data == b"config":
            return json.dumps(dict(self.config), sort_keys=True), 200
        if data == b"count":
            return str(self.runs), 200
        if data == b"pid":
            return str(os.getpid()), 200
        return data
