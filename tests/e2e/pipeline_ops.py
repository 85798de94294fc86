"""Ops for the pipeline end-to-end tests."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from gateway.pipelines.ops import OpError


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


class InWorker:
    """Doubles ``x`` and says which process it ran in; refuses negative values (422)."""

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        x = np.asarray(inputs["x"], dtype=np.float32)
        if (x < 0).any():
            raise OpError("x must not be negative", 422)
        return {"y": x * 2, "pid": np.array([os.getpid()], dtype=np.int64)}


class AroundScore:
    """A transformer around a Python predictor: doubles ``x`` before it (float64, cast to the
    predictor's declared float32 on the way), marks its labels after it."""

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"x": np.asarray(inputs["x"], dtype=np.float64) * 2}

    def postprocess(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
        marked = np.array([f"{label}!" for label in outputs["label"]], dtype=object)
        return {"score": outputs["score"], "label": marked}
