"""scikit-learn processor: an estimator saved with joblib or pickle (``model: iris.joblib``).

The file is read with ``joblib.load``, which reads plain pickles too. Loading a pickle runs
code the file names, so the configuration lets such a service load only from the
operator's ``gateway.model_dirs`` (gateway.config.values.check_model_dirs); see
docs/processors.md. Outputs: ``predict``, and ``predict_proba`` when the estimator has it
(a classifier, or a pipeline ending in one). The input is ``[-1, n_features_in_]`` in FP64
(the dtype scikit-learn computes in) unless the service declares it: a model without
``n_features_in_`` (a pipeline starting with a text vectorizer, say) needs ``inputs:``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from gateway.worker.processors.base import LoadError
from gateway.worker.processors.estimator import EstimatorProcessor, Method


class SklearnProcessor(EstimatorProcessor):
    platform = "sklearn"
    default_dtype = "FP64"
    expects = "a scikit-learn model (a joblib or pickle file)"

    def load_model(self, path: str) -> None:
        import joblib

        # Runs the pickle's code: the config lets this read only gateway.model_dirs.
        model: Any = joblib.load(path)
        if not callable(getattr(model, "predict", None)):
            raise LoadError(
                f"{Path(path).name} holds a {type(model).__name__}, not a scikit-learn estimator "
                "(it has no predict method)"
            )
        # Columns arrive as an array, in the order the model was fitted with: a model fitted
        # on a DataFrame would warn on every call that they have no names.
        warnings.filterwarnings("ignore", message="X does not have valid feature names", category=UserWarning)
        self.model = model

    def n_features(self) -> int | None:
        n = getattr(self.model, "n_features_in_", None)
        return int(n) if isinstance(n, int) else None

    def methods(self) -> dict[str, Method]:
        out: dict[str, Method] = {"predict": self.model.predict}
        # A probe of a third-party object: available_if hides predict_proba where it does not apply.
        if hasattr(self.model, "predict_proba"):
            out["predict_proba"] = self.model.predict_proba
        return out


__all__ = ["SklearnProcessor"]
