"""Python ops the pipeline tests run: real classes loaded the way a user's ops are."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from gateway.worker.ops import OpError


class Scale:
    """y = x * factor (config), in float32."""

    def initialize(self) -> None:
        self.factor = float(self.config.get("factor", 1.0))

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"y": np.asarray(inputs["x"], dtype=np.float32) * self.factor}


class Sleep:
    """Sleeps ``seconds`` (config), then passes ``x`` on as ``y``; counts how many run at once."""

    def initialize(self) -> None:
        self.seconds = float(self.config.get("seconds", 0.1))
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(self.seconds)
        finally:
            with self.lock:
                self.running -= 1
        return {"y": inputs["x"]}


class FailOnNegative:
    """Refuses negative inputs (422), breaks (500) on values over 100, passes the rest on."""

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        x = np.asarray(inputs["x"], dtype=np.float32)
        if (x > 100).any():
            raise RuntimeError("cannot handle values over 100")
        if (x < 0).any():
            raise OpError("x must not be negative", 422)
        return {"y": x}


class AroundModel:
    """A transformer: doubles the input before the model, adds 1 to the model's answer."""

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"x": np.asarray(inputs["x"], dtype=np.float32) * 2}

    def postprocess(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
        return {"y": outputs["y"] + 1}
