"""A user's Python predictor (an EAS custom processor), called by a pipeline's model step:
it reads the JSON form (docs/processors.md) and answers in it, as it does for KServe."""

from __future__ import annotations

import json
from typing import Any


class ScorePredictor:
    """``score`` = the sum of each row of ``x``; ``label`` = "high" when it is over
    ``threshold`` (config), else "low"."""

    def initialize(self) -> None:
        self.threshold = float(self.config.get("threshold", 1.0))

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1]}],
            "outputs": [
                {"name": "score", "datatype": "FP32", "shape": [-1]},
                {"name": "label", "datatype": "BYTES", "shape": [-1]},
            ],
        }

    def process(self, data: bytes, headers: dict[str, str]) -> tuple[bytes, int, str]:
        doc = json.loads(data)
        x = doc["inputs"]["x"]
        if x.get("dtype") != "float32" or len(x["shape"]) != 2:
            message = f"x: expected float32[N,M], got {x.get('dtype')}{x['shape']}"
            return json.dumps({"message": message}).encode(), 400, "application/json"
        rows, cols = x["shape"]
        flat = x["data"]
        scores = [sum(flat[r * cols : (r + 1) * cols]) for r in range(rows)]
        labels = ["high" if s > self.threshold else "low" for s in scores]
        outputs = {
            "score": {"dtype": "float32", "shape": [rows], "data": scores},
            "label": {"dtype": "string", "shape": [rows], "data": labels},
        }
        wanted = doc.get("outputs") or list(outputs)
        answer = {"outputs": {name: outputs[name] for name in wanted}}
        return json.dumps(answer).encode(), 200, "application/json"
