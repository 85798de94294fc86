"""Python processors for worker tests, loaded by their ``package.module:Class`` entry
(``tests.gateway.workers.fixture_processors:...``) in real spawned workers."""

from __future__ import annotations

import os
import time


class Misbehaving:
    """Echoes the body; a few bodies make ``process`` raise what no processor should."""

    def process(self, data: bytes) -> bytes | str:
        if data == b"exit":
            raise SystemExit(3)
        if data == b"interrupt":
            raise KeyboardInterrupt
        if data == b"generator-exit":
            raise GeneratorExit
        if data.startswith(b"sleep:"):
            time.sleep(float(data[6:]))
            return "slept"
        if data == b"pid":
            return str(os.getpid())
        return data
