"""A python processor that writes every way a processor can: ``print``, ``sys.stderr``,
``logging`` and a native write to file descriptor 1. Answers ``ok``."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any


class Printing:
    config: dict[str, Any] = {}
    model_path: str | None = None

    def initialize(self) -> None:
        print("printed while loading")

    def process(self, data: bytes) -> bytes:
        text = data.decode()
        print("printed", text, "in", "pieces", end="")
        print(" and ended")
        print(f"to stderr {text}", file=sys.stderr)
        logging.getLogger("my.processor").warning("logged %s", text)
        os.write(1, f"native {text}\n".encode())
        return b"ok"
