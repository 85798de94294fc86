"""User code served as models (docs/processors.md, "Tensors in, tensors out"): what the
tests of the model protocols' clients against ``python`` services run."""

from __future__ import annotations

from typing import Any

import numpy as np


class Scorer:
    """Declares its tensors as class attributes: ``score`` = each row of ``x`` summed, times
    ``scale`` (config); ``label`` = each ``tag`` (UTF-8 bytes) upper-cased; a negative ``x``
    raises. ``explain`` says which column of ``x`` gave most to each row's score."""

    inputs = [
        {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "tag", "datatype": "BYTES", "shape": [-1]},
    ]
    outputs = [
        {"name": "score", "datatype": "FP32", "shape": [-1]},
        {"name": "label", "datatype": "BYTES", "shape": [-1]},
    ]

    def initialize(self) -> None:
        self.scale = float(self.config.get("scale", 1.0))

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        x = inputs["x"]
        if (x < 0).any():
            raise ValueError("x holds a negative value")
        return {"score": x.sum(axis=1) * self.scale, "label": [t.decode().upper() for t in inputs["tag"]]}

    def explain(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        x = inputs["x"] * self.scale
        return {"score": x.argmax(axis=1).astype(np.float32), "label": [b"column"] * len(x)}


class Doubler:
    """Declares its tensors with ``metadata()``; no explain of its own."""

    def metadata(self) -> dict[str, Any]:
        return {
            "platform": "user-code",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
            "outputs": [{"name": "y", "datatype": "FP64", "shape": [-1, 3]}],
        }

    def predict(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return inputs["x"] * 2  # float32, answered as the declared FP64


class Attribution:
    """An explainer service for ``Doubler``: takes its inputs, says each value's share."""

    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    outputs = [{"name": "share", "datatype": "FP32", "shape": [-1, 3]}]

    def predict(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = inputs["x"]
        return [x / x.sum(axis=1, keepdims=True)]


class Sleeper:
    """A predictor that takes ``seconds`` (config) to answer: ``y`` = ``x``."""

    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}]

    def initialize(self) -> None:
        self.seconds = float(self.config.get("seconds", 1.0))

    def predict(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        import time

        time.sleep(self.seconds)
        return [inputs["x"]]
