"""Tiny models of the estimator runtimes, trained on scikit-learn's bundled iris data, and
what each library computes for them in-process (the numbers the gateway must give back).

    files = build(folder)        # runtime -> model file, in the form each library saves
    x = features("xgboost")      # the rows a test sends, in the runtime's input dtype
    want = expected("xgboost", files["xgboost"], x)   # output name -> array

``sklearn``: a logistic regression in a joblib file; ``xgboost``: an ``XGBClassifier`` saved
as JSON (served through the scikit-learn interface: labels and probabilities); ``booster``:
a plain XGBoost ``Booster`` saved as UBJSON (probabilities only); ``lightgbm``: an
``LGBMClassifier``'s booster as its text file. Each trains in well under a second.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# runtime -> (processor, the file's name, the input dtype its processor declares by default)
MODELS: dict[str, tuple[str, str, type]] = {
    "sklearn": ("sklearn", "iris.joblib", np.float64),
    "xgboost": ("xgboost", "iris-xgb.json", np.float32),
    "booster": ("xgboost", "iris-booster.ubj", np.float32),
    "lightgbm": ("lightgbm", "iris-lgb.txt", np.float64),
}
# The outputs each one answers, in the order its metadata lists them.
OUTPUTS: dict[str, tuple[str, ...]] = {
    "sklearn": ("predict", "predict_proba"),
    "xgboost": ("predict", "predict_proba"),
    "booster": ("predict",),
    "lightgbm": ("predict",),
}


def _iris() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_iris

    x, y = load_iris(return_X_y=True)
    return x, y


def build(folder: Path) -> dict[str, Path]:
    import joblib
    import lightgbm as lgb
    import xgboost as xgb
    from sklearn.linear_model import LogisticRegression

    folder.mkdir(parents=True, exist_ok=True)
    x, y = _iris()
    paths = {name: folder / file for name, (_, file, _) in MODELS.items()}
    joblib.dump(LogisticRegression(max_iter=1000).fit(x, y), paths["sklearn"])
    clf = xgb.XGBClassifier(n_estimators=8, max_depth=3, n_jobs=1).fit(x, y)
    clf.save_model(paths["xgboost"])
    clf.get_booster().save_model(paths["booster"])
    lgb.LGBMClassifier(n_estimators=8, num_leaves=7, n_jobs=1, verbose=-1).fit(x, y).booster_.save_model(
        paths["lightgbm"]
    )
    return paths


def tiny_pickle(path: Path) -> Path:
    """The smallest scikit-learn model the sklearn processor loads, at ``path``: a pickle, whose
    loading runs code (for the tests of where such a file may be loaded from)."""
    import joblib
    from sklearn.linear_model import LogisticRegression

    joblib.dump(LogisticRegression().fit([[0.0], [1.0]], [0, 1]), path)
    return path


def features(name: str, rows: slice = slice(0, 150, 15)) -> np.ndarray:
    """Rows of iris across its three classes, in the runtime's input dtype."""
    return np.ascontiguousarray(_iris()[0][rows], dtype=MODELS[name][2])


def expected(name: str, path: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    """What the library itself computes from the saved file, as its users load it."""
    if name == "sklearn":
        import joblib

        model = joblib.load(path)
        return {"predict": model.predict(x), "predict_proba": model.predict_proba(x)}
    if name == "xgboost":
        import xgboost as xgb

        clf = xgb.XGBClassifier()
        clf.load_model(path)
        return {"predict": clf.predict(x), "predict_proba": clf.predict_proba(x)}
    if name == "booster":
        import xgboost as xgb

        return {"predict": xgb.Booster(model_file=str(path)).inplace_predict(x)}
    import lightgbm as lgb

    return {"predict": lgb.Booster(model_file=str(path)).predict(x)}


__all__ = ["MODELS", "OUTPUTS", "build", "expected", "features", "tiny_pickle"]
