"""Python ops the pipeline tests run: real classes loaded the way a user's ops are."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from gateway.worker.ops import OpError


class Scale:
    """y = x * factor (config), in float32."""

    def initialize(self) -> None:
        self.factor = float(self.config.get("factor", 1.0))

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"y": np.asarray(inputs["x"], dtype=np.float32) * self.factor}


# How long an op waits for the test's signal before it gives up: only reached when the
# behaviour under test is broken (the step then fails, and so does the test).
GIVE_UP_S = 10.0

# Meet ops' barriers by party name: the file is imported once per process, so every step
# of a pipeline shares these.
_BARRIERS: dict[str, threading.Barrier] = {}
_BARRIERS_LOCK = threading.Lock()


class Meet:
    """Passes ``x`` on as ``y`` once ``parties`` (config) runs of the same ``party`` are
    running at the same time: steps that must run side by side fail when they do not."""

    def initialize(self) -> None:
        parties = int(self.config.get("parties", 2))
        party = str(self.config["party"])
        with _BARRIERS_LOCK:
            if party not in _BARRIERS or _BARRIERS[party].broken:  # a failed test's is not reused
                _BARRIERS[party] = threading.Barrier(parties)
            self.barrier = _BARRIERS[party]

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        try:
            self.barrier.wait(GIVE_UP_S)
        except threading.BrokenBarrierError:
            raise RuntimeError("the other runs of the party never came") from None
        return {"y": inputs["x"]}


class Hold:
    """Passes ``x`` on as ``y``; while the test holds it (``hold()`` until ``release()``),
    each run waits. Counts how many run at once (``running``, and ``most`` ever)."""

    def initialize(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0

    def hold(self) -> None:
        self.open.clear()

    def release(self) -> None:
        self.open.set()

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if not self.open.wait(GIVE_UP_S):
                raise RuntimeError("the test never released this run")
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
