"""The estimator runtimes (sklearn, xgboost, lightgbm) in-process: their config (a pickle only
from gateway.model_dirs, declared inputs), a file of another format refused with a message
naming the format expected, metadata from the model or the declaration, one request checked
and answered, and requests batched into one call of the library. The protocols end to end:
tests/e2e/test_estimators_e2e.py."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.config import BatchingConfig, ConfigError, ServiceConfig, parse_config, parse_service
from gateway.config.pipelines import TensorDecl
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.core.metadata import DATATYPES
from gateway.manage.spec import spec_of
from gateway.worker.processors.base import LoadError, ProcessorError
from gateway.worker.processors.estimator import EstimatorProcessor
from gateway.worker.processors.registry import create_processor
from tests.e2e.estimator_models import MODELS, OUTPUTS, build, expected, features

JSON_FORM = {"X-Eas-Request-Format": "json"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build(tmp_path_factory.mktemp("estimators"))


def _service(name: str, path: Path, **extra: object) -> ServiceConfig:
    return ServiceConfig(name="m", processor=MODELS[name][0], model=str(path), **extra)  # type: ignore[arg-type]


def _config(model: Path, dirs: list[str] | None, **extra: object) -> object:
    gateway = {"model_dirs": dirs} if dirs is not None else {}
    service = {"name": "m", "processor": "sklearn", "model": str(model), "public": True, **extra}
    return parse_config({"gateway": gateway, "services": [service]})


def test_a_pickle_loads_only_from_the_model_dirs(models: dict[str, Path], tmp_path: Path) -> None:
    path = models["sklearn"]
    with pytest.raises(ConfigError, match=r"\(m\)\.model: a sklearn model is a pickle.*gateway\.model_dirs"):
        _config(path, None)
    with pytest.raises(ConfigError, match=r"iris\.joblib is outside the model directories"):
        _config(path, [str(tmp_path)])
    _config(path, [str(path.parent)])
    # The other runtimes' files are data: no model_dirs needed.
    parse_config({"services": [{"name": "x", "processor": "xgboost", "model": str(models["xgboost"]),
                                "public": True}]})  # fmt: skip


def test_declared_inputs(models: dict[str, Path]) -> None:
    dirs = [str(models["sklearn"].parent)]
    svc = _config(models["sklearn"], dirs, inputs={"features": {"dtype": "float32", "shape": [-1, 4]}})
    assert svc.services[0].inputs == (TensorDecl("features", "FP32", (-1, 4)),)  # type: ignore[attr-defined]
    # As the admin API shows and stores it, and back.
    spec = spec_of(svc.services[0], redact=False)  # type: ignore[attr-defined]
    assert spec["inputs"] == {"features": {"dtype": "FP32", "shape": [-1, 4]}}
    assert parse_service(json.loads(json.dumps(spec))).inputs == svc.services[0].inputs  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"\.inputs: the model takes one input .*2 given"):
        _config(models["sklearn"], dirs, inputs={"a": "float32", "b": "float32"})
    with pytest.raises(
        ConfigError, match=r"\(o\)\.inputs: only a sklearn, xgboost, lightgbm\b.* service declares its inputs"
    ):
        # A python class declares its tensors too (as a model of its own); a queue has none.
        parse_config({"services": [{"name": "o", "processor": "queue", "public": True,
                                    "inputs": {"a": "float32"}}]})  # fmt: skip


@pytest.mark.parametrize(
    ("name", "wrong", "message"),
    [
        (
            "sklearn",
            "lightgbm",
            r"cannot load iris-lgb\.txt as a scikit-learn model \(a joblib or pickle file\)",
        ),
        ("xgboost", "sklearn", r"cannot load iris\.joblib as an XGBoost model \(a JSON or UBJSON file"),
        ("lightgbm", "xgboost", r"cannot load iris-xgb\.json as a LightGBM model \(a text file"),
    ],
)
def test_a_file_of_another_format_is_refused(
    models: dict[str, Path], name: str, wrong: str, message: str
) -> None:
    with pytest.raises(LoadError, match=message):
        create_processor(_service(name, models[wrong])).load()


def test_a_pickle_that_is_no_estimator_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "settings.pkl"
    path.write_bytes(pickle.dumps({"threshold": 0.5}))
    with pytest.raises(LoadError, match=r"settings\.pkl holds a dict, not a scikit-learn estimator"):
        create_processor(_service("sklearn", path)).load()


@pytest.mark.parametrize("name", list(MODELS))
def test_one_request_against_the_library(models: dict[str, Path], name: str) -> None:
    proc = create_processor(_service(name, models[name]))
    proc.load()
    x = features(name)
    resp = proc.handle(
        WorkerRequest(json.dumps({"inputs": {"input": x.tolist()}}).encode(), headers=JSON_FORM)
    )
    outs = json.loads(resp.body)["outputs"]
    for out, want in expected(name, models[name], x).items():
        t = outs[out]
        np.testing.assert_array_equal(np.array(t["data"], dtype=t["dtype"]).reshape(t["shape"]), want)
    narrow = {"inputs": {"input": x[:, :3].tolist()}}
    with pytest.raises(ProcessorError, match=r"input 'input': expected float(32|64)\[-1,4\], got"):
        proc.handle(WorkerRequest(json.dumps(narrow).encode(), headers=JSON_FORM))


@pytest.mark.parametrize(("name", "dtype"), [("lightgbm", "FP32"), ("xgboost", "FP64")])
def test_a_declared_input_names_and_types_it(models: dict[str, Path], name: str, dtype: str) -> None:
    """A service's ``inputs:`` (from the config) names the model's input and sets its dtype, one
    other than the runtime's default; the width stays the model's."""
    service = {"name": "m", "processor": name, "model": str(models[name]), "public": True}
    declared = {"features": {"dtype": dtype, "shape": [-1, -1]}}
    (svc,) = parse_config({"services": [{**service, "inputs": declared}]}).services
    assert svc.inputs == (TensorDecl("features", dtype, (-1, -1)),)
    proc = create_processor(svc)
    proc.load()
    meta = proc.metadata()
    assert [t.as_json() for t in meta.inputs] == [{"name": "features", "datatype": dtype, "shape": [-1, 4]}]
    x = features(name).astype(DATATYPES[dtype])
    req = WorkerRequest(json.dumps({"inputs": {"features": x.tolist()}}).encode(), headers=JSON_FORM)
    assert proc.prepare(req).feeds["features"].dtype == DATATYPES[dtype]  # what the library is given
    outs = json.loads(proc.handle(req).body)["outputs"]
    for out, want in expected(name, models[name], x).items():
        t = outs[out]
        np.testing.assert_array_equal(np.array(t["data"], dtype=t["dtype"]).reshape(t["shape"]), want)
    default_name = json.dumps({"inputs": {"input": x.tolist()}}).encode()
    with pytest.raises(ProcessorError, match=r"unknown input 'input'; model inputs: features$"):
        proc.handle(WorkerRequest(default_name, headers=JSON_FORM))
    wrong = _service(name, models[name], inputs=(TensorDecl("features", dtype, (-1, 7)),))
    with pytest.raises(LoadError, match=r"the model takes 4 features .*declares \[-1, 7\]"):
        create_processor(wrong).load()


def test_a_text_pipeline_takes_a_declared_string_input(tmp_path: Path) -> None:
    """A model whose file does not say its input (a vectorizer first) is served as declared."""
    import joblib
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.naive_bayes import MultinomialNB
    from sklearn.pipeline import make_pipeline

    texts, labels = (
        ["good fine great", "bad awful poor", "great good", "poor bad"],
        ["pos", "neg", "pos", "neg"],
    )
    model = make_pipeline(CountVectorizer(), MultinomialNB()).fit(texts, labels)
    path = tmp_path / "reviews.joblib"
    joblib.dump(model, path)
    proc = create_processor(_service("sklearn", path, inputs=(TensorDecl("text", "BYTES", (-1,)),)))
    proc.load()
    meta = proc.metadata()
    assert meta.outputs[0].as_json() == {"name": "predict", "datatype": "BYTES", "shape": [-1]}
    body = json.dumps({"inputs": {"text": ["great fine", "awful"]}, "outputs": ["predict"]}).encode()
    outs = json.loads(proc.handle(WorkerRequest(body, headers=JSON_FORM)).body)["outputs"]
    assert outs["predict"]["data"] == model.predict(["great fine", "awful"]).tolist() == ["pos", "neg"]


def _counting(real: Callable[..., Any], calls: list[int]) -> Callable[..., Any]:
    def counted(self: object, x: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(x))
        return real(self, x, *args, **kwargs)

    return counted


def _count_library_calls(name: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each call of the library's own methods, from now on: patched on their
    classes, where the processor's methods (bound at load) still reach them."""
    cls: type
    if name == "sklearn":
        from sklearn.linear_model import LogisticRegression

        cls, methods = LogisticRegression, ("predict", "predict_proba")
    elif name in ("xgboost", "booster"):
        import xgboost as xgb

        cls, methods = xgb.Booster, ("inplace_predict",)
    else:
        import lightgbm as lgb

        cls, methods = lgb.Booster, ("predict",)
    calls: list[int] = []
    for method in methods:
        monkeypatch.setattr(cls, method, _counting(getattr(cls, method), calls))
    return calls


@pytest.mark.parametrize("name", list(MODELS))
def test_requests_are_batched_along_rows(
    models: dict[str, Path], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests with the same form share one model run: each output is one call of the library
    over every caller's rows, and each caller gets its own rows of what the library computes."""
    calls = _count_library_calls(name, monkeypatch)
    proc = create_processor(_service(name, models[name], batching=BatchingConfig(max_batch_size=16)))
    proc.load()
    assert isinstance(proc, EstimatorProcessor) and proc.supports_batching
    calls.clear()  # the probes at load, a row of zeros each
    x = features(name)
    parts = [x[:1], x[1:4], x[4:]]
    items = [
        proc.prepare(WorkerRequest(json.dumps({"inputs": {"input": p.tolist()}}).encode(), headers=JSON_FORM))
        for p in parts
    ]
    assert len({item.key for item in items}) == 1
    answers = proc.process_batch(items)
    assert calls == [len(x)] * len(OUTPUTS[name])
    for part, answer in zip(parts, answers, strict=True):
        assert isinstance(answer, WorkerResponse)
        outs = json.loads(answer.body)["outputs"]
        for out, want in expected(name, models[name], part).items():
            t = outs[out]
            got = np.array(t["data"], dtype=t["dtype"]).reshape(t["shape"])
            np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"{name} {out}")


def _xgb_cases(tmp_path: Path) -> dict[str, tuple[Path, np.ndarray]]:
    """XGBoost models through the scikit-learn interface, one per way its methods decide."""
    import xgboost as xgb
    from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits

    xd, yd = load_digits(return_X_y=True)
    xb, yb = load_breast_cancer(return_X_y=True)
    xr, yr = load_diabetes(return_X_y=True)
    stop = {"n_estimators": 60, "early_stopping_rounds": 2}
    made = {
        "multi-class": (xgb.XGBClassifier(n_estimators=4, max_depth=3).fit(xd, yd), xd),
        "binary": (xgb.XGBClassifier(n_estimators=4).fit(xb, yb), xb),
        "early-stopped": (
            xgb.XGBClassifier(**stop).fit(xb[:400], yb[:400], eval_set=[(xb[400:], yb[400:])], verbose=False),
            xb,
        ),
        "multi-label": (xgb.XGBClassifier(n_estimators=4).fit(xd, np.stack([yd > 4, yd % 2 == 0], 1)), xd),
        "softmax": (xgb.XGBClassifier(n_estimators=4, objective="multi:softmax").fit(xd, yd), xd),
        "regressor": (
            xgb.XGBRegressor(**stop).fit(xr[:300], yr[:300], eval_set=[(xr[300:], yr[300:])], verbose=False),
            xr,
        ),
    }
    out = {}
    for name, (model, x) in made.items():
        path = tmp_path / f"{name}.ubj"
        model.save_model(path)
        x = x.astype(np.float32)
        x[3, 2] = np.nan  # a missing value, as the model's own setting reads it
        out[name] = (path, x)
    return out


def test_xgboost_estimators_answer_as_their_interface_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The xgboost processor serves a scikit-learn interface's model by its Booster directly
    (but for an objective it leaves to the interface), and must answer every method exactly as
    the interface's own method does on the same rows."""
    import xgboost as xgb

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the interface's own method ran")

    for name, (path, x) in _xgb_cases(tmp_path).items():
        proc = create_processor(ServiceConfig(name="m", processor="xgboost", model=str(path)))
        proc.load()
        model = xgb.XGBRegressor() if name == "regressor" else xgb.XGBClassifier()
        model.load_model(path)
        methods = ("predict",) if name == "regressor" else ("predict", "predict_proba")
        assert [t.name for t in proc.metadata().outputs] == list(methods), name
        with monkeypatch.context() as m:
            if name != "softmax":
                for cls in (xgb.XGBClassifier, xgb.XGBRegressor):
                    m.setattr(cls, "predict", refuse)
                    m.setattr(cls, "predict_proba", refuse, raising=False)
            got = proc.run(list(methods), {"input": x})
        for method, answer in zip(methods, got, strict=True):
            want = getattr(model, method)(x, validate_features=False)
            assert answer.dtype == want.dtype and answer.shape == want.shape, (name, method)
            np.testing.assert_array_equal(answer, want, err_msg=f"{name} {method}")
        if name in ("early-stopped", "regressor"):
            # The trees past the best iteration change the answer: leaving them in would show.
            every_tree = model.get_booster().inplace_predict(x, validate_features=False)
            assert not np.array_equal(every_tree, model.predict_proba(x)[:, 1] if name != "regressor"
                                      else model.predict(x)), name  # fmt: skip
