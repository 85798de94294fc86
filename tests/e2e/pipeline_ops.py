"""Ops for the pipeline end-to-end tests."""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from gateway.worker.ops import OpError


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
    """Doubles ``x`` and says which process it ran in, with plain Python values beside the
    tensors: a ``label`` string and an ``info`` dict; refuses negative values (422)."""

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        x = np.asarray(inputs["x"], dtype=np.float32)
        if (x < 0).any():
            raise OpError("x must not be negative", 422)
        info = {"count": int(x.size), "top": float(x.max()), "tags": ["a", ("b", 2)], "raw": b"\x00\xff"}
        base = inputs["x"]
        while isinstance(base, np.ndarray):
            base = base.base
        if isinstance(base, memoryview):
            base = base.obj
        return {
            "y": x * 2,
            "pid": np.array([os.getpid()], dtype=np.int64),
            "label": "big" if x.sum() > 3 else "small",
            "info": info,
            "mapped": isinstance(base, mmap.mmap),  # x came in shared memory
        }


class Describe:
    """A later step (in the gateway) reading the plain values the worker's op answered."""

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        info, label = inputs["info"], inputs["label"]
        assert isinstance(label, str) and isinstance(info, dict), (type(label), type(info))
        assert isinstance(info["raw"], bytes) and info["tags"] == ["a", ("b", 2)], info
        return {"summary": f"{label}: {info['count']} values up to {info['top']:g}, raw {info['raw'].hex()}"}


class AroundScore:
    """A transformer around a Python predictor: doubles ``x`` before it (float64, cast to the
    predictor's declared float32 on the way), marks its labels after it."""

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"x": np.asarray(inputs["x"], dtype=np.float64) * 2}

    def postprocess(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
        marked = np.array([f"{label}!" for label in outputs["label"]], dtype=object)
        return {"score": outputs["score"], "label": marked}
