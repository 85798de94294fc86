"""Build the small sample ONNX models used by examples, tests and benchmarks.

Everything is built offline, in a few seconds (most of it fitting the digits classifier);
a slow build's line is printed as it starts, every model's when it is done:

* ``digits.onnx``: logistic regression on scikit-learn's bundled 8x8 digits data set.
  Input ``input`` float32[N,64]; outputs ``label`` int64[N] and ``probabilities``
  float32[N,10] (a plain tensor: ``zipmap`` is off).
* ``multi.onnx``: a hand-made graph for dtype and positional tests.
  Inputs ``x`` float32[N,4], ``y`` int64[N,4], ``z`` float64[N,4];
  outputs ``sum`` float32[N,4] = x + float(y), ``yy`` int64[N,4] = y * 2,
  ``zneg`` float64[N,4] = -z, ``mask`` uint8[N,4] = (y > 0).
* ``spin.onnx``: a Loop of ``n`` (int64 scalar input) additions; output ``count`` float32[1].
  Its run time is chosen by the caller (about 1 us per iteration).
* ``cluster_serving.onnx``: the async ``cs`` service's model in ``services.yaml``, one input
  of each Cluster Serving kind (built by ``build_cluster_serving_model.py``, reused here).
* ``digits.joblib``, ``digits-xgb.json``, ``digits-lgb.txt`` (not built by ``build_all``;
  :func:`build_estimators`, served by ``samples/estimators.yaml``): the digits classifier as
  scikit-learn (a random forest, with joblib), XGBoost (``save_model``'s JSON) and LightGBM
  (its text file) save it, for the ``sklearn``, ``xgboost`` and ``lightgbm`` processors;
  trained on the same pixels as ``digits.onnx`` (scaled to 0..1). Each only where its
  library is installed (the package's extra of the same name); a line names the others.
* ``mlp_1024x1024x4.onnx`` (not built by ``build_all``; :func:`build_mlp`, used by
  benchmarks/bench_batching.py): input ``x`` float32[N,1024], four 1024x1024 MatMul+Add
  layers with Relu between them (random weights, fixed seed); output ``y`` float32[N,1024].

Usage: ``python samples/build_models.py [out_dir]`` (default ``samples/models``): every
model ``samples/services.yaml`` names, then those of ``samples/estimators.yaml``. Idempotent:
an existing, loadable model is kept (``cluster_serving.onnx`` is rewritten only when its bytes
differ). The tools come with the package's ``samples`` extra; without them the script says
which are missing and how to install them.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE / "models"
# Tensor names clients need.
DIGITS_INPUT = "input"
DIGITS_OUTPUTS = ("label", "probabilities")
MULTI_INPUTS = ("x", "y", "z")
MULTI_OUTPUTS = ("sum", "yy", "zneg", "mask")
# What the samples import -> the distribution that brings it (the package's samples extra).
TOOLS = {"numpy": "numpy", "onnx": "onnx", "skl2onnx": "skl2onnx", "sklearn": "scikit-learn", "PIL": "pillow"}
# What building the models takes of them.
BUILD_TOOLS = ("numpy", "onnx", "skl2onnx", "sklearn")


def missing_tools(modules: tuple[str, ...] = BUILD_TOOLS) -> list[str]:
    """The distributions of ``modules`` this interpreter cannot import."""
    return [TOOLS[m] for m in modules if importlib.util.find_spec(m) is None]


def exit_if_tools_missing(script: str, modules: tuple[str, ...] = BUILD_TOOLS) -> None:
    """Say what is missing and how to get it, instead of an ImportError's traceback (for
    this script, or for a sample client by the modules it needs)."""
    missing = missing_tools(modules)
    if not missing:
        return
    pyproject = (HERE.parent / "pyproject.toml").read_text()
    version = re.search(r'^version = "(.+)"$', pyproject, re.M)
    # What python -m build makes in the checkout these samples are part of.
    wheel = f"dist/easkit-{version.group(1) if version else '<version>'}-py3-none-any.whl"
    sys.exit(
        f"{script} needs {', '.join(TOOLS[m] for m in modules)}; missing here: {', '.join(missing)}.\n"
        "Install the package's samples extra into this environment:\n"
        f'  pip install "{wheel}[gateway,samples]"   # the wheel python -m build made\n'
        '  pip install -e ".[samples]"   # or, in a checkout, the sources themselves'
    )


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def build_digits(path: Path) -> Path:
    import numpy as np
    from skl2onnx import to_onnx
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    clf = LogisticRegression(max_iter=300)
    clf.fit(x, y)
    onx = to_onnx(
        clf,
        x[:1],
        options={id(clf): {"zipmap": False}},
        target_opset=17,
        final_types=None,
    )
    # Name the input and outputs predictably for clients.
    onx.graph.input[0].name = DIGITS_INPUT
    for node in onx.graph.node:
        node.input[:] = [DIGITS_INPUT if n == "X" else n for n in node.input]
    # A named batch dimension reads better in error messages ("float32[N,64]").
    for vi in list(onx.graph.input) + list(onx.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims and not dims[0].dim_param:
            dims[0].dim_param = "N"
    _write_atomic(path, onx.SerializeToString())
    return path


def build_multi(path: Path) -> Path:
    from onnx import TensorProto, helper

    n = "N"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 4])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [n, 4])
    z = helper.make_tensor_value_info("z", TensorProto.DOUBLE, [n, 4])
    out_sum = helper.make_tensor_value_info("sum", TensorProto.FLOAT, [n, 4])
    out_yy = helper.make_tensor_value_info("yy", TensorProto.INT64, [n, 4])
    out_z = helper.make_tensor_value_info("zneg", TensorProto.DOUBLE, [n, 4])
    out_mask = helper.make_tensor_value_info("mask", TensorProto.UINT8, [n, 4])
    two = helper.make_tensor("two", TensorProto.INT64, [], [2])
    zero = helper.make_tensor("zero", TensorProto.INT64, [], [0])
    nodes = [
        helper.make_node("Cast", ["y"], ["yf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "yf"], ["sum"]),
        helper.make_node("Mul", ["y", "two"], ["yy"]),
        helper.make_node("Neg", ["z"], ["zneg"]),
        helper.make_node("Greater", ["y", "zero"], ["gt"]),
        helper.make_node("Cast", ["gt"], ["mask"], to=TensorProto.UINT8),
    ]
    graph = helper.make_graph(nodes, "multi", [x, y, z], [out_sum, out_yy, out_z, out_mask], [two, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _write_atomic(path, model.SerializeToString())
    return path


def spin_loop_body() -> Any:
    """The body of a Loop that adds 1.0 to a float32[1] per iteration (about 1 us each):
    a run time the caller chooses, for timeout and cancellation tests."""
    from onnx import TensorProto, helper

    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "one"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])],
    )
    return body


def build_spin(path: Path) -> Path:
    """``spin.onnx``: input ``n`` int64 scalar; a Loop adds 1.0 ``n`` times; output ``count``
    float32[1]. About 1 us per iteration: a model whose run time the caller chooses
    (timeout and cancellation tests)."""
    from onnx import TensorProto, helper

    body = spin_loop_body()
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "cond", "v0"], ["count"], body=body)],
        "spin",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("count", TensorProto.FLOAT, [1])],
        [
            helper.make_tensor("cond", TensorProto.BOOL, [], [True]),
            helper.make_tensor("v0", TensorProto.FLOAT, [1], [0.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _write_atomic(path, model.SerializeToString())
    return path


def build_mlp(path: Path, width: int = 1024, layers: int = 4, seed: int = 0, tokens: int = 0) -> Path:
    """An MLP with a dynamic batch dimension: input ``x`` float32[N,width], ``layers``
    MatMul+Add layers (Relu between them), output ``y`` float32[N,width]. Weights are
    random from ``seed`` (scaled so activations stay O(1)); about 16 MB at 1024x4.
    ``tokens > 0`` makes every row a [tokens, width] matrix (x float32[N,tokens,width]):
    each row is then a matrix product of its own, which batching cannot speed up much."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    cur = "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)).astype(np.float32)
        b = (rng.standard_normal(width, dtype=np.float32) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == layers - 1
        nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], ["y" if last else f"a{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [f"h{i}"]))
            cur = f"h{i}"
    dims: list[int | str] = ["N", tokens, width] if tokens > 0 else ["N", width]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _write_atomic(path, model.SerializeToString())
    return path


def build_cluster_serving(out_dir: Path) -> Path:
    """``cluster_serving.onnx`` in ``out_dir``, by ``build_cluster_serving_model.build`` (loaded
    from its file, so this works whatever ``sys.path`` holds)."""
    spec = importlib.util.spec_from_file_location(
        "_easkit_build_cluster_serving_model", HERE / "build_cluster_serving_model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path: Path = module.build(out_dir)
    return path


BUILDERS = {"digits.onnx": build_digits, "multi.onnx": build_multi, "spin.onnx": build_spin}
# What each build does, said before it starts (the digits one takes seconds).
DOING = {"digits.onnx": "fitting a logistic regression on scikit-learn's digits and converting it"}


def _loadable(path: Path) -> bool:
    if not path.exists() or path.stat().st_size == 0:
        return False
    try:
        import onnx

        onnx.checker.check_model(onnx.load(str(path)))
    except Exception:
        return False
    return True


def build_all(out_dir: str | Path | None = None, progress: Any = None) -> dict[str, Path]:
    """Build every sample model into ``out_dir`` (idempotent); return name -> path.

    ``progress``: called with a line as each model's build starts (what it is doing) and one
    when it is built or found (the command line prints them, so a first build that takes a
    while shows where it is)."""
    out = Path(out_dir) if out_dir is not None else DEFAULT_DIR
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    total = len(BUILDERS) + 1
    for i, (name, builder) in enumerate(BUILDERS.items(), 1):
        path = out / name
        started = time.monotonic()
        if _loadable(path):
            note = "already built"
        else:
            if progress is not None and name in DOING:
                progress(f"[{i}/{total}] {name}: building ({DOING[name]}) ...")
            builder(path)
            note = f"built in {time.monotonic() - started:.1f} s"
        if progress is not None:
            progress(f"[{i}/{total}] {name}: {note}")
        paths[name.removesuffix(".onnx")] = path
    paths["cluster_serving"] = build_cluster_serving(out)
    if progress is not None:
        progress(f"[{total}/{total}] cluster_serving.onnx: ready")
    return paths


# samples/estimators.yaml's models: file -> the module its library is imported as (and the
# package's extra that brings it).
ESTIMATORS = {"digits.joblib": "sklearn", "digits-xgb.json": "xgboost", "digits-lgb.txt": "lightgbm"}


def _digits_scaled() -> tuple[Any, Any]:
    import numpy as np
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y


def _fit_estimator(name: str, path: Path) -> None:
    x, y = _digits_scaled()
    tmp = path.with_name(".tmp-" + path.name)  # the suffix says the format to save_model
    if name == "digits.joblib":
        import joblib
        from sklearn.ensemble import RandomForestClassifier

        joblib.dump(
            RandomForestClassifier(n_estimators=10, max_depth=8, random_state=0, n_jobs=1).fit(x, y), tmp
        )
    elif name == "digits-xgb.json":
        import xgboost

        xgboost.XGBClassifier(n_estimators=20, max_depth=4, random_state=0, n_jobs=1).fit(x, y).save_model(
            tmp
        )
    else:
        import lightgbm

        model = lightgbm.LGBMClassifier(n_estimators=20, num_leaves=15, random_state=0, n_jobs=1, verbose=-1)
        model.fit(x, y).booster_.save_model(tmp)
    tmp.replace(path)


def build_estimators(out_dir: str | Path | None = None, progress: Any = None) -> dict[str, Path]:
    """The digits classifier for the sklearn, xgboost and lightgbm processors, each where its
    library is installed (idempotent); return name -> path of those built or found."""
    out = Path(out_dir) if out_dir is not None else DEFAULT_DIR
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    missing = []
    for name, module in ESTIMATORS.items():
        path = out / name
        if importlib.util.find_spec(module) is None:
            missing.append(module)
            continue
        started = time.monotonic()
        if path.is_file() and path.stat().st_size:
            note = "already built"
        else:
            _fit_estimator(name, path)
            note = f"built in {time.monotonic() - started:.1f} s"
        if progress is not None:
            progress(f"{name}: {note}")
        paths[name] = path
    if missing and progress is not None:
        extras = ",".join(missing)  # each library's extra has its module's name
        progress(
            f"not built (samples/estimators.yaml serves them): the {', '.join(missing)} model(s); "
            f'install their extras to build them: pip install -e ".[{extras}]"'
        )
    return paths


if __name__ == "__main__":
    exit_if_tools_missing("build_models.py")
    out_dir = sys.argv[1] if len(sys.argv) > 1 else None
    built = build_all(out_dir, progress=lambda line: print(line, flush=True))
    built |= build_estimators(out_dir, progress=lambda line: print(line, flush=True))
    for name, p in built.items():
        print(f"{name}: {p}")
