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

import numpy as np

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
        if _direct(model):
            return _direct_methods(model)
        out: dict[str, Method] = {"predict": lambda x: model.predict(x, validate_features=False)}
        if hasattr(model, "predict_proba"):
            out["predict_proba"] = lambda x: model.predict_proba(x, validate_features=False)
        return out


# A classifier's objectives whose labels and probabilities are the Booster's probabilities
# and a decision on them, which _direct_methods makes as the scikit-learn interface does.
_CLASS_OBJECTIVES = {"binary:logistic", "multi:softprob"}


def _direct(model: Any) -> bool:
    """Whether ``model``'s methods are served by _direct_methods: each call of the scikit-learn
    interface's own switches XGBoost's global configuration there and back (three calls into
    the library, each through JSON) and looks up settings the file fixed, which costs a small
    model more than its trees do. A linear booster (predicted another way) or an objective
    not listed keeps the interface's methods."""
    if model.booster == "gblinear":
        return False
    kind = type(model).__name__
    return kind == "XGBRegressor" or (kind == "XGBClassifier" and model.objective in _CLASS_OBJECTIVES)


def _direct_methods(model: Any) -> dict[str, Method]:
    """``predict`` (and a classifier's ``predict_proba``) as the interface computes them, for
    the settings loaded from the file: the trees early stopping chose, the missing value."""
    booster = model.get_booster()
    try:
        last = (0, booster.best_iteration + 1)
    except AttributeError:  # no early stopping: every tree
        last = (0, 0)
    missing = model.missing

    def values(x: np.ndarray) -> Any:
        return booster.inplace_predict(x, iteration_range=last, missing=missing, validate_features=False)

    if type(model).__name__ == "XGBRegressor":
        return {"predict": values}
    n_classes = model.n_classes_

    def labels(x: np.ndarray) -> np.ndarray:
        p = values(x)
        if p.ndim > 1 and n_classes != 2:  # one probability a class: the likeliest
            return np.argmax(p, axis=1)
        if p.ndim > 1 and p.shape[1] != 1:  # one probability a label: each that passes half
            return (p > 0.5).astype(np.float64)
        return (p > 0.5).astype(np.int64)  # a probability of class 1

    def probabilities(x: np.ndarray) -> np.ndarray:
        p = values(x)
        if p.ndim == 2 and (p.shape[1] == n_classes or (n_classes == 2 and p.shape[1] >= n_classes)):
            return p
        return np.vstack((1.0 - p, p)).transpose()

    return {"predict": labels, "predict_proba": probabilities}


__all__ = ["XGBoostProcessor"]
