"""A pipeline op written as Paddle Serving's examples write one (no paddle import: the
gateway takes the class by its signatures), for tests/e2e/test_paddle_pipeline_e2e.py."""

from __future__ import annotations

from typing import Any

import numpy as np


class UciOp:
    def init_op(self) -> None:
        self.separator = ","

    def preprocess(self, input_dicts: dict[str, Any], data_id: int, log_id: int) -> Any:
        ((_, input_dict),) = input_dicts.items()
        x = input_dict["x"]
        if isinstance(x, str):
            x = np.array([np.float32(v.strip()) for v in x.split(self.separator)]).reshape(1, 13)
        mode = input_dict["mode"]
        if mode == "skip":  # answered without the model
            return {"price": np.full((1, 1), -1.0, np.float32)}, True, None, ""
        if mode == "refuse":
            return {}, False, 7, "the features are out of range"
        if mode == "raise":
            raise RuntimeError("the op broke")
        if mode == "short":
            return {"x": x}, False
        return {"x": np.asarray(x, np.float32)}, False, None, ""

    def postprocess(
        self, input_dicts: dict[str, Any], fetch_dict: dict[str, Any], data_id: int, log_id: int
    ) -> Any:
        ((_, input_dict),) = input_dicts.items()
        if input_dict["mode"] == "bad-post":
            return fetch_dict
        return {"price": fetch_dict["price"]}, None, ""
