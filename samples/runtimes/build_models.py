"""Build the sample models of the torch, tensorflow and pmml runtimes, offline, in seconds.

* ``models/image_net.pt``: a TorchScript module (``torch.jit.script``) taking ``image``
  float32[N,3,H,W] and returning ``(probabilities float32[N,10], label int64[N])``: a 3x3
  convolution, global average pooling and a linear layer, fixed-seed weights. The EAS
  guide's PyTorch demo sends it one 3x224x224 image.
* ``models/mnist_saved_model/``: a TensorFlow SavedModel with the signatures
  ``predict_images`` (the guide's TensorFlow demo) and ``serving_default``, both taking
  ``images`` float32[N,784] and answering ``scores`` float32[N,10] and ``classes`` int64[N]:
  one linear layer and a softmax, fixed-seed weights.
* ``models/scorecard.pmml``: a PMML 4.4 logistic regression (``RegressionModel``) over two
  numeric fields ``fea1`` and ``fea2``, the fields of the guide's PMML demo, with the binary
  target ``y``; fitted by scikit-learn on points made here, written by this script.

Usage: ``python samples/runtimes/build_models.py [out_dir] [--only torch,tensorflow,pmml]``.
Each model needs its own library (the package's ``torch``, ``tensorflow`` and ``pmml``
extras; the PMML file only scikit-learn); a model whose library is missing is skipped with
a line saying so, unless ``--only`` names it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from xml.sax.saxutils import quoteattr

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE / "models"
# file name -> (the library that builds it, the extra that brings it)
MODELS = {
    "image_net.pt": ("torch", "torch"),
    "mnist_saved_model": ("tensorflow", "tensorflow"),
    "scorecard.pmml": ("sklearn", "samples"),
}
KINDS = {"image_net.pt": "torch", "mnist_saved_model": "tensorflow", "scorecard.pmml": "pmml"}
PMML_FIELDS = ("fea1", "fea2")
IMAGE_PIXELS = 784


def build_torch(path: Path) -> Path:
    import torch

    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # torch.jit.script reads the module's source from its file
    from image_net import ImageNet

    torch.manual_seed(0)
    with warnings.catch_warnings():
        # PyTorch 2.13 deprecates TorchScript for torch.export; TorchScript is still the file
        # EAS's PyTorch processor (and so the guide's demo) serves.
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.script(ImageNet().eval())
    tmp = path.with_suffix(".tmp")
    module.save(str(tmp))
    tmp.replace(path)
    return path


def build_savedmodel(path: Path) -> Path:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    weights = tf.constant(rng.normal(0, 0.05, (IMAGE_PIXELS, 10)).astype(np.float32))
    bias = tf.constant(rng.normal(0, 0.1, 10).astype(np.float32))

    class Mnist(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, IMAGE_PIXELS], tf.float32, name="images")])
        def predict_images(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
            logits = tf.matmul(images, weights) + bias
            return {"scores": tf.nn.softmax(logits), "classes": tf.argmax(logits, axis=1)}

    model = Mnist()
    fn = model.predict_images.get_concrete_function()
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tf.saved_model.save(model, str(tmp), signatures={"predict_images": fn, "serving_default": fn})
    shutil.rmtree(path, ignore_errors=True)
    tmp.replace(path)
    return path


def scorecard_points() -> tuple[list[list[float]], list[int]]:
    """Points over (fea1, fea2), labelled by a fixed line with some noise (seeded)."""
    import numpy as np

    rng = np.random.default_rng(7)
    x = rng.uniform(0, 5, (400, 2))
    y = (x[:, 0] - 0.6 * x[:, 1] + rng.normal(0, 0.7, 400) > 1.2).astype(int)
    return x.tolist(), y.tolist()


def pmml_text() -> str:
    """A PMML RegressionModel (logistic regression, ``softmax`` over two classes' tables)
    with the coefficients scikit-learn fits on :func:`scorecard_points`."""
    from sklearn.linear_model import LogisticRegression

    x, y = scorecard_points()
    fit = LogisticRegression().fit(x, y)
    coef = [float(c) for c in fit.coef_[0]]
    fields = "".join(
        f'    <DataField name="{f}" optype="continuous" dataType="double"/>\n' for f in PMML_FIELDS
    )
    mining = "".join(f'      <MiningField name="{f}"/>\n' for f in PMML_FIELDS)
    predictors = "".join(
        f'        <NumericPredictor name="{f}" coefficient={quoteattr(repr(c))}/>\n'
        for f, c in zip(PMML_FIELDS, coef, strict=True)
    )
    intercept = repr(float(fit.intercept_[0]))
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<PMML xmlns="http://www.dmg.org/PMML-4_4" version="4.4">
  <Header description="A scorecard-like logistic regression over fea1 and fea2 (easkit samples)"/>
  <DataDictionary numberOfFields="3">
{fields}    <DataField name="y" optype="categorical" dataType="integer">
      <Value value="0"/>
      <Value value="1"/>
    </DataField>
  </DataDictionary>
  <RegressionModel functionName="classification" modelName="scorecard" normalizationMethod="logit">
    <MiningSchema>
{mining}      <MiningField name="y" usageType="target"/>
    </MiningSchema>
    <RegressionTable targetCategory="1" intercept={quoteattr(intercept)}>
{predictors}    </RegressionTable>
    <RegressionTable targetCategory="0" intercept="0.0"/>
  </RegressionModel>
</PMML>
"""


def build_pmml(path: Path) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(pmml_text())
    tmp.replace(path)
    return path


BUILDERS = {"image_net.pt": build_torch, "mnist_saved_model": build_savedmodel, "scorecard.pmml": build_pmml}


def build_all(out_dir: Path = DEFAULT_DIR, only: tuple[str, ...] = ()) -> dict[str, Path]:
    """Build every model whose library is here (``only``: those runtimes, or fail)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    built = {}
    for name, (module, extra) in MODELS.items():
        kind = KINDS[name]
        if only and kind not in only:
            continue
        if importlib.util.find_spec(module) is None:
            if only:
                sys.exit(f"{name}: needs {module}; install the package's {extra} extra")
            print(f"{name}: skipped ({module} is not installed; the package's {extra} extra brings it)")
            continue
        started = time.perf_counter()
        built[kind] = BUILDERS[name](out_dir / name)
        print(f"{name}: built in {time.perf_counter() - started:.1f} s", flush=True)
    return built


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--only", default="", help="comma-separated: torch, tensorflow, pmml")
    args = parser.parse_args(argv)
    build_all(args.out_dir, tuple(k for k in args.only.split(",") if k))


if __name__ == "__main__":
    main()
