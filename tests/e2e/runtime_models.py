"""The torch, tensorflow and pmml runtimes' sample models (samples/runtimes/build_models.py,
built offline into a test's folder) and what each library computes for them in-process.

    files = build(folder)                 # runtime -> model path
    x = features("torch")                 # the rows a test sends, in the model's input dtype
    want = expected("torch", files["torch"], x)   # output name -> array
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
# runtime -> (the sample's file, its input's name, its input dtype, the signature a TF call names)
MODELS: dict[str, tuple[str, str, type]] = {
    "torch": ("image_net.pt", "image", np.float32),
    "tensorflow": ("mnist_saved_model", "images", np.float32),
    "pmml": ("scorecard.pmml", "input", np.float64),
}
# The outputs each answers, in the order its metadata lists them.
OUTPUTS: dict[str, tuple[str, ...]] = {
    "torch": ("output__0", "output__1"),
    "tensorflow": ("classes", "scores"),
    "pmml": ("predict", "predict_proba"),
}
PLATFORMS = {"torch": "pytorch_libtorch", "tensorflow": "tensorflow_savedmodel", "pmml": "pmml"}
# The declaration a torch service needs (TorchScript keeps no dtypes or shapes).
TORCH_INPUTS = {"image": {"dtype": "FP32", "shape": [-1, 3, 224, 224]}}
TF_SIGNATURE = "predict_images"


def sample_builder() -> ModuleType:
    path = ROOT / "samples" / "runtimes" / "build_models.py"
    spec = importlib.util.spec_from_file_location("runtime_sample_models", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(folder: Path) -> dict[str, Path]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    built: dict[str, Path] = sample_builder().build_all(folder)
    return built


def features(name: str, rows: int = 2, seed: int = 0) -> np.ndarray:
    """``rows`` inputs for the model, in its input dtype: images for torch and tensorflow,
    (fea1, fea2) points across both classes for pmml."""
    rng = np.random.default_rng(seed)
    if name == "torch":
        return rng.random((rows, 3, 224, 224), dtype=np.float32)
    if name == "tensorflow":
        return rng.random((rows, 784), dtype=np.float32)
    return np.array([[1.0, 2.0], [4.0, 0.5], [2.5, 1.5], [0.2, 4.8]] * rows, dtype=np.float64)[:rows]


def expected(name: str, path: Path, x: np.ndarray, signature: str = TF_SIGNATURE) -> dict[str, np.ndarray]:
    """What the library itself computes from the saved model, as its users load it."""
    if name == "torch":
        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript, deprecated in 2.13
            module = torch.jit.load(str(path))
        with torch.inference_mode():
            probabilities, label = module(torch.from_numpy(x.copy()))
        return {"output__0": probabilities.numpy(), "output__1": label.numpy()}
    if name == "tensorflow":
        import tensorflow as tf

        out = tf.saved_model.load(str(path)).signatures[signature](images=tf.constant(x))
        return {k: v.numpy() for k, v in out.items()}
    from sklearn_pmml_model.auto_detect import auto_detect_estimator

    model: Any = auto_detect_estimator(pmml=str(path))
    return {"predict": model.predict(x), "predict_proba": model.predict_proba(x)}


def same(got: Any, wanted: np.ndarray, what: str) -> None:
    """The library's numbers in its dtype: integers exactly, floats to float32's last bits
    (a batch run in the gateway may add up a convolution in another order than one here)."""
    got = np.asarray(got)
    assert got.shape == wanted.shape, (what, got.shape, wanted.shape)
    if wanted.dtype.kind == "f":
        np.testing.assert_allclose(got.astype(wanted.dtype), wanted, rtol=2e-6, atol=1e-7, err_msg=what)
    else:
        np.testing.assert_array_equal(got.astype(wanted.dtype), wanted, err_msg=what)


__all__ = [
    "MODELS",
    "OUTPUTS",
    "PLATFORMS",
    "ROOT",
    "TF_SIGNATURE",
    "TORCH_INPUTS",
    "build",
    "expected",
    "features",
    "same",
    "sample_builder",
]
