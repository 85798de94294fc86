"""An op for the pipeline end-to-end tests: a transformer around a shared feature model."""

from __future__ import annotations

from typing import Any

import numpy as np


class AroundFeatures:
    """Scales the pixels before the model (``factor`` in config); after it, adds the
    features' length as ``norm``."""

    def initialize(self) -> None:
        self.factor = float(self.config.get("factor", 1.0))

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"pixels": np.asarray(inputs["pixels"]) * self.factor}  # float64: cast to the model's float32

    def postprocess(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
        features = outputs["features"]
        return {"features": features, "norm": np.linalg.norm(features, axis=-1)}
