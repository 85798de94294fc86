"""XGBoost processor: a model saved by ``save_model`` as JSON (``.json``) or UBJSON (``.ubj``).

A model saved through the scikit-learn interface (``XGBClassifier``, ``XGBRegressor``,
``XGBRanker``) carries that in the file, and is served as it: ``predict`` (class labels for
a classifier) and, for a classifier, ``predict_proba``. A plain ``Booster``'s file is served
as the Booster: ``predict``, what ``Booster.inplace_predict`` gives (probabilities for a
classification objective, values for a regression). The input is ``[-1, num_features()]`` in
FP32 (the dtype XGBoost computes in) unless the service declares it. ``intra_op_threads``
is XGBoost's ``nthread``.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.worker.processors.estimator import EstimatorProcessor, Method

# The scikit-learn interface's classes by the estimator type its files record.
_SKLEARN_TYPES = {"classifier": "XGBClassifier", "regressor": "XGBRegressor", "ranker": "XGBRanker"}


class XGBoostProcessor(EstimatorProcessor):
    platform = "xgboost"
    default_dtype = "FP32"
    expects = "an XGBoost model (a JSON or UBJSON file, as save_model writes)"

    def load_model(self, path: str) -> None:
        import xgboost as xgb

        threads = self.service.intra_op_threads
        booster = xgb.Booster(params={"nthread": threads}, model_file=path)
        kind = json.loads(booster.attr("scikit_learn") or "{}").get("_estimator_type")
        self.booster = booster
        self.model: Any = None
        if kind in _SKLEARN_TYPES:
            self.model = getattr(xgb, _SKLEARN_TYPES[kind])(n_jobs=threads)
            self.model.load_model(path)

    def n_features(self) -> int | None:
        n = self.booster.num_features()
        return n if n > 0 else None

    def methods(self) -> dict[str, Method]:
        # Features are checked against the signature already; XGBoost's own check of their
        # names would refuse the unnamed columns every request brings.
        model = self.model
        if model is None:
            booster = self.booster
            return {"predict": lambda x: booster.inplace_predict(x, validate_features=False)}
        out: dict[str, Method] = {"predict": lambda x: model.predict(x, validate_features=False)}
        if hasattr(model, "predict_proba"):
            out["predict_proba"] = lambda x: model.predict_proba(x, validate_features=False)
        return out


__all__ = ["XGBoostProcessor"]
