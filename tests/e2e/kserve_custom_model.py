"""Existing ``kserve.Model`` subclasses, as KServe's users write them: served unchanged by a
``python`` service where the kserve package is installed (tests/e2e/test_kserve_model_e2e.py)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from kserve import InferInput, InferOutput, InferRequest, InferResponse, Model
from kserve.errors import InvalidInput


class Scaler(Model):
    """``load`` sets the factor; ``preprocess`` checks the instances (V1) or the tensor x
    (V2), ``predict`` scales them (async, as KServe allows), ``postprocess`` adds the model's
    name; ``explain`` its own. One class for V1 and V2, as under KServe."""

    def __init__(self, name: str, factor: float = 2.0) -> None:
        super().__init__(name)
        self.factor = factor
        self.loaded = False

    def load(self) -> bool:
        self.loaded = True
        self.ready = True
        return self.ready

    def preprocess(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        if isinstance(payload, InferRequest):
            x = payload.get_input_by_name("x")
            if x is None or x.datatype != "FP32":
                raise InvalidInput("expected an FP32 input 'x'")
            return payload
        instances = payload.get("instances")
        if not isinstance(instances, list):
            raise ValueError("expected {'instances': [...]}")
        return {"instances": instances}

    async def predict(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        if isinstance(payload, InferRequest):
            x = payload.get_input_by_name("x")
            assert x is not None
            rows = x.as_numpy()
            if rows.ndim != 2:
                raise RuntimeError(f"x must be rows, got shape {list(rows.shape)}")
            y = InferOutput("y", list(rows.shape), "FP32")
            y.set_data_from_numpy((rows * self.factor).astype(np.float32), binary_data=False)
            asked = [o.name for o in payload.request_outputs or ()]
            seen = InferOutput("seen", [len(payload.inputs)], "BYTES")
            # What the model was handed: each input's name, datatype, shape and data type.
            described = [f"{i.name}:{i.datatype}:{i.shape}:{type(i.data).__name__}" for i in payload.inputs]
            seen.set_data_from_numpy(np.array(described, dtype=object), binary_data=False)
            # The call's own id and parameters, as the model got them.
            call = InferOutput("call", [2], "BYTES")
            params = json.dumps(payload.parameters or {}, sort_keys=True)
            call.set_data_from_numpy(np.array([str(payload.id), params], dtype=object), binary_data=False)
            outputs = [o for o in (y, seen, call) if not asked or o.name in asked]
            return InferResponse(payload.id, payload.model_name, outputs)
        return {"predictions": [[v * self.factor for v in row] for row in payload["instances"]]}

    def postprocess(
        self, result: Any, headers: dict[str, str] | None = None, response_headers: Any = None
    ) -> Any:
        if isinstance(result, InferResponse):
            return result
        return {**result, "model": self.name, "loaded": self.loaded}

    def explain(self, payload: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        return {
            "explanations": [
                [round(abs(v) / sum(map(abs, row)), 3) for v in row] for row in payload["instances"]
            ]
        }


class Plain(Model):
    """A model with KServe's default explain (it asks an explainer host): none of its own; its
    predict reads V1 instances only, so a V2 call fails in it (500, as KServe answers)."""

    def load(self) -> bool:
        self.ready = True
        return True

    def predict(self, payload: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        return {"predictions": payload["instances"]}


class Counter(Model):
    """Answers V2 calls with a V2 response dict, and declares its tensors as KServe models do
    (``get_input_types``/``get_output_types``, async here)."""

    def load(self) -> bool:
        self.ready = True
        return True

    async def get_input_types(self) -> list[dict[str, Any]]:
        return [{"name": "b", "datatype": "UINT8", "shape": [-1]}]

    async def get_output_types(self) -> list[dict[str, Any]]:
        return [{"name": "next", "datatype": "UINT8", "shape": [-1]}]

    def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> dict[str, Any]:
        b = payload.inputs[0]
        data = [(v + 1) % 256 for v in b.data]
        answer = {"name": "next", "datatype": "UINT8", "shape": b.shape, "data": data}
        return {"model_name": self.name, "id": payload.id, "outputs": [answer]}


class Relay(Model):
    """A transformer, as KServe writes one: ``preprocess`` adds a ``tag`` input to a V2 call,
    KServe's own default ``predict`` sends it to the predictor (ModelServer's
    ``--predictor_host`` and ``--predictor_protocol``; the service's config here)."""

    def load(self) -> bool:
        self.ready = True
        return True

    def preprocess(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        x = payload.get_input_by_name("x")
        tag = InferInput("tag", [x.shape[0]], "BYTES")
        tag.set_data_from_numpy(np.array([b"relayed"] * x.shape[0], dtype=object), binary_data=False)
        return InferRequest(self.name, [x, tag], request_id=payload.id)
