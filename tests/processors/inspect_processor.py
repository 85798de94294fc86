"""A python processor that answers each JSON input back as an output of the same name.

It shows exactly what the gateway's Cluster Serving path handed to the workers (names,
shapes, dtypes, values), so the REST tests can check the mapping of every BigDL request example.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np


class InspectProcessor:
    config: dict[str, Any] = {}
    model_path: str | None = None

    def initialize(self) -> None:
        return None

    def process(self, data: bytes) -> tuple[bytes, int]:
        doc = json.loads(data)
        out: dict[str, Any] = {}
        for name, value in doc["inputs"].items():
            if isinstance(value, dict):
                dtype = value.get("dtype")
                flat = value["data"]
                shape = value["shape"]
                if dtype is None:
                    dtype = "loose-" + np.asarray(flat).dtype.kind if flat else "loose"
            else:
                arr = np.asarray(value)
                dtype, flat, shape = "nested", arr.reshape(-1).tolist(), list(arr.shape)
            out[name] = {"dtype": "string" if dtype == "string" else "float64", "shape": shape, "data": flat}
            out[name + ":dtype"] = {"dtype": "string", "shape": [], "data": [dtype]}
        return json.dumps({"outputs": out}).encode(), 200
