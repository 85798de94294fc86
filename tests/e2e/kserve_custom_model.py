"""Existing ``kserve.Model`` subclasses, as KServe's users write them: served unchanged by a
``python`` service where the kserve package is installed (tests/e2e/test_kserve_model_e2e.py)."""

from __future__ import annotations

from typing import Any

from kserve import Model


class Scaler(Model):
    """``load`` sets the factor; ``preprocess`` checks the instances, ``predict`` scales them
    (async, as KServe allows), ``postprocess`` adds the model's name; ``explain`` its own."""

    def __init__(self, name: str, factor: float = 2.0) -> None:
        super().__init__(name)
        self.factor = factor
        self.loaded = False

    def load(self) -> bool:
        self.loaded = True
        self.ready = True
        return self.ready

    def preprocess(self, payload: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        instances = payload.get("instances")
        if not isinstance(instances, list):
            raise ValueError("expected {'instances': [...]}")
        return {"instances": instances}

    async def predict(self, payload: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        return {"predictions": [[v * self.factor for v in row] for row in payload["instances"]]}

    def postprocess(
        self, result: Any, headers: dict[str, str] | None = None, response_headers: Any = None
    ) -> Any:
        return {**result, "model": self.name, "loaded": self.loaded}

    def explain(self, payload: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        return {
            "explanations": [
                [round(abs(v) / sum(map(abs, row)), 3) for v in row] for row in payload["instances"]
            ]
        }


class Plain(Model):
    """A model with KServe's default explain (it asks an explainer host): none of its own."""

    def load(self) -> bool:
        self.ready = True
        return True

    def predict(self, payload: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        return {"predictions": payload["instances"]}
