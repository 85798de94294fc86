"""LightGBM processor: a model saved by ``Booster.save_model`` as text (``model.txt``).

Served as the Booster (as KServe's and MLServer's LightGBM runtimes do): one output,
``predict``, what ``Booster.predict`` gives (probabilities for a classification objective,
one column per class for a multiclass one; values for a regression). The input is
``[-1, num_feature()]`` in FP64 unless the service declares it (FP32 is read as it is).
``intra_op_threads`` is LightGBM's ``num_threads``.
"""

from __future__ import annotations

from gateway.worker.processors.estimator import EstimatorProcessor, Method


class LightGBMProcessor(EstimatorProcessor):
    platform = "lightgbm"
    default_dtype = "FP64"
    expects = "a LightGBM model (a text file, as Booster.save_model writes)"

    def load_model(self, path: str) -> None:
        import lightgbm as lgb

        self.booster = lgb.Booster(model_file=path)

    def n_features(self) -> int | None:
        n = self.booster.num_feature()
        return n if n > 0 else None

    def methods(self) -> dict[str, Method]:
        booster, threads = self.booster, self.service.intra_op_threads
        return {"predict": lambda x: booster.predict(x, num_threads=threads)}


__all__ = ["LightGBMProcessor"]
