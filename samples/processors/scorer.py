"""Scorer: user code served as a model (python processor sample).

It declares its tensors, so KServe's V1/V2 (REST and gRPC), Triton's clients and Cluster
Serving call it as they call an ONNX model (docs/processors.md, "Tensors in, tensors out"):
``features`` is a batch of rows of 4 numbers; ``score`` is each row's weighted sum and
``label`` says whether it passes ``threshold`` (the service's ``config``). ``explain`` answers
each feature's part of each score (``shares``), in the same form.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Scorer:
    inputs = [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]
    outputs = [
        {"name": "score", "datatype": "FP32", "shape": [-1]},
        {"name": "label", "datatype": "BYTES", "shape": [-1]},
    ]
    weights = np.array([0.5, 0.25, 0.125, 0.125], dtype=np.float32)

    # Set by the python processor loader before initialize().
    config: dict[str, Any] = {}

    def initialize(self) -> None:
        self.threshold = float(self.config.get("threshold", 1.0))

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        score = inputs["features"] @ self.weights
        return {"score": score, "label": np.where(score >= self.threshold, "pass", "fail")}

    def explain(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        # An explanation may name tensors of its own: each feature's part of each row's score.
        return {"shares": inputs["features"] * self.weights}
