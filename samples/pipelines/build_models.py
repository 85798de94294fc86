"""Build the sample pipelines' models offline, from data bundled with scikit-learn and here.

* ``digits_features.onnx``: PCA (16 components) of scikit-learn's 8x8 digits, the feature
  model a pipeline shares with direct callers (the ``digits-features`` service).
  Input ``pixels`` float32[N,64] in [0, 1]; output ``features`` float32[N,16].
* ``digits_classifier.onnx``: logistic regression on those features.
  Input ``features`` float32[N,16]; outputs ``label`` int64[N], ``probabilities`` float32[N,10].
* ``text_classifier.onnx``: a bag-of-words logistic regression over the bundled reviews
  (reviews.tsv), written with onnx.helper so that it takes word ids: input ``ids``
  int64[N,L] (0: padding), ``Gather`` of each word's class weights, summed, plus the bias,
  softmax: output ``probabilities`` float32[N,3] over ``negative, neutral, positive``.

Usage: ``python samples/pipelines/build_models.py [out_dir]`` (default ``samples/models``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE.parent / "models"
TEXT_LABELS = ("negative", "neutral", "positive")


def _rename(onx: Any, inputs: dict[str, str], outputs: dict[str, str]) -> Any:
    """Give a converted model's tensors the names the pipeline config uses, with a named
    batch dimension."""
    names = {**inputs, **outputs}
    for vi in list(onx.graph.input) + list(onx.graph.output):
        vi.name = names.get(vi.name, vi.name)
        dims = vi.type.tensor_type.shape.dim
        if dims and not dims[0].dim_param:
            dims[0].dim_param = "N"
    for node in onx.graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
    return onx


def build_digits(out: Path) -> tuple[Path, Path]:
    import numpy as np
    from skl2onnx import to_onnx
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    pca = PCA(n_components=16, random_state=0).fit(x)
    features = pca.transform(x).astype(np.float32)
    clf = LogisticRegression(max_iter=500).fit(features, y)
    feat = to_onnx(pca, x[:1], target_opset=17)
    feat = _rename(feat, {feat.graph.input[0].name: "pixels"}, {feat.graph.output[0].name: "features"})
    cls = to_onnx(clf, features[:1], options={id(clf): {"zipmap": False}}, target_opset=17)
    cls = _rename(
        cls,
        {cls.graph.input[0].name: "features"},
        {cls.graph.output[0].name: "label", cls.graph.output[1].name: "probabilities"},
    )
    paths = out / "digits_features.onnx", out / "digits_classifier.onnx"
    for path, model in zip(paths, (feat, cls), strict=True):
        path.write_bytes(model.SerializeToString())
    return paths


def build_text(out: Path) -> Path:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    sys.path.insert(0, str(HERE))
    import text_ops

    rows = text_ops.reviews()
    vocab = text_ops.vocabulary()
    # CountVectorizer numbers words from 0; the op (and the table below) from 1.
    vec = CountVectorizer(
        vocabulary={w: i - 1 for w, i in vocab.items()},
        tokenizer=text_ops.words,
        token_pattern=None,
        lowercase=False,
    )
    bags = vec.transform([text for _, text in rows])
    clf = LogisticRegression(max_iter=1000, C=10.0).fit(bags, [label for label, _ in rows])
    assert tuple(clf.classes_) == TEXT_LABELS
    # Row i of the table holds word id i's weight for each class; row 0 (padding) is zero.
    table = np.zeros((len(vocab) + 1, len(TEXT_LABELS)), dtype=np.float32)
    table[1:] = clf.coef_.T
    nodes = [
        helper.make_node("Gather", ["weights", "ids"], ["per_word"], axis=0),
        helper.make_node("ReduceSum", ["per_word", "axis1"], ["summed"], keepdims=0),
        helper.make_node("Add", ["summed", "bias"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "text_classifier",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "L"])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", len(TEXT_LABELS)])],
        [
            numpy_helper.from_array(table, "weights"),
            numpy_helper.from_array(clf.intercept_.astype(np.float32), "bias"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every supported ONNX Runtime loads
    path = out / "text_classifier.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def build_all(out_dir: str | Path | None = None) -> list[Path]:
    out = Path(out_dir) if out_dir is not None else DEFAULT_DIR
    out.mkdir(parents=True, exist_ok=True)
    return [*build_digits(out), build_text(out)]


if __name__ == "__main__":
    # samples/build_models.py, by its path: this file has the same module name.
    spec = importlib.util.spec_from_file_location("_easkit_sample_models", HERE.parent / "build_models.py")
    assert spec is not None and spec.loader is not None
    samples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(samples)
    samples.exit_if_tools_missing("pipelines/build_models.py")
    for p in build_all(sys.argv[1] if len(sys.argv) > 1 else None):
        print(p)
