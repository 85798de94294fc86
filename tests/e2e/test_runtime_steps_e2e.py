"""Pipeline steps that run a model file of their own in the scikit-learn, XGBoost and LightGBM
runtimes, beside one another in one pipeline served by the real gateway: on worker processes
of their own and in the gateway's threads, each step's runtime picked by its file's suffix
or named by ``processor:``. Every output is the library's own number for the same rows, and
a pickle step is held to the operator's model folders as a pickle service is.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eas_sdk import PredictClient, TFRequest
from eas_sdk.errors import BadRequestError
from tests.e2e.estimator_models import build, expected, features
from tests.e2e.gateway_proc import GatewayProcess
from tests.e2e.pipeline_http import wait_ready

pytestmark = pytest.mark.slow

TOKEN = "runtime-steps-token-5d07c2e9"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    paths = build(tmp_path_factory.mktemp("step-models"))
    # A file whose name says no runtime: the step names it (processor: xgboost).
    paths["booster-unnamed"] = Path(shutil.copy(paths["booster"], paths["booster"].with_name("iris.model")))
    return paths


def pipeline(models: dict[str, Path]) -> dict[str, Any]:
    """Three own-model steps reading the same rows, each in another runtime and placement."""
    return {
        "name": "iris-runtimes", "processor": "pipeline", "token": TOKEN, "pipeline": {
            "inputs": {"x": {"dtype": "float64", "shape": [-1, 4]}},
            "steps": [
                # sklearn by the .joblib suffix, on worker processes of its own (the default)
                {"name": "lr", "model": str(models["sklearn"]), "inputs": {"input": "request.x"},
                 "outputs": ["predict_proba"]},
                # lightgbm by the .txt suffix, in the gateway's threads
                {"name": "gbm", "model": str(models["lightgbm"]), "placement": "thread",
                 "inputs": {"input": "request.x"}, "outputs": ["predict"]},
                # named: the file's suffix says nothing; the float64 rows are cast to its float32
                {"name": "xgb", "model": str(models["booster-unnamed"]), "processor": "xgboost",
                 "inputs": {"input": "request.x"}, "outputs": ["predict"]},
                {"name": "top", "transform": "argmax", "inputs": {"x": "lr.predict_proba"},
                 "outputs": ["index"]},
            ],
            "outputs": {"proba": "lr.predict_proba", "label": "top.index", "gbm": "gbm.predict",
                        "xgb": "xgb.predict"},
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> Iterator[GatewayProcess]:
    config = {
        "gateway": {"model_dirs": [str(models["sklearn"].parent)]},
        "services": [pipeline(models)],
    }
    proc = GatewayProcess.start(config, tmp_path_factory.mktemp("steps-gw"))
    try:
        wait_ready(proc, timeout=120)
        yield proc
    finally:
        proc.kill()


def test_each_step_gives_its_library_s_numbers(gw: GatewayProcess, models: dict[str, Path]) -> None:
    x = features("sklearn")  # float64, as the pipeline declares its input
    with PredictClient(gw.url, "iris-runtimes", token=TOKEN) as client:
        req = TFRequest("serving_default")
        req.add_feed("x", list(x.shape), TFRequest.DT_DOUBLE, x)
        resp = client.predict(req)
    proba = expected("sklearn", models["sklearn"], x)["predict_proba"]
    np.testing.assert_array_equal(resp.to_numpy("proba"), proba)
    np.testing.assert_array_equal(resp.to_numpy("label"), proba.argmax(axis=1))
    np.testing.assert_array_equal(
        resp.to_numpy("gbm"), expected("lightgbm", models["lightgbm"], x)["predict"]
    )
    wanted = expected("booster", models["booster"], x.astype(np.float32))["predict"]
    np.testing.assert_array_equal(resp.to_numpy("xgb"), wanted)


def test_the_steps_run_where_they_are_placed(gw: GatewayProcess) -> None:
    # Each step's runs are listed as workers: of their own process, or the gateway's for the
    # step in its threads.
    workers = gw.services()["iris-runtimes"].get("workers", [])
    pids = {w["step"]: w["pid"] for w in workers if w.get("state") == "ready"}
    assert set(pids) == {"lr", "gbm", "xgb"}
    assert pids["gbm"] == gw.pid and gw.pid not in (pids["lr"], pids["xgb"]) and pids["lr"] != pids["xgb"]
    meta = gw.call_json("/v2/models/iris-runtimes", headers={"Authorization": TOKEN})[1]
    # The outputs' types come from the steps' models: sklearn's float64, XGBoost's float32.
    types = {o["name"]: o["datatype"] for o in meta["outputs"]}
    assert types == {"proba": "FP64", "label": "INT64", "gbm": "FP64", "xgb": "FP32"}


def test_a_wrong_shape_is_refused_naming_the_input(gw: GatewayProcess) -> None:
    with PredictClient(gw.url, "iris-runtimes", token=TOKEN) as client:
        req = TFRequest("serving_default")
        req.add_feed("x", [2, 3], TFRequest.DT_DOUBLE, np.zeros((2, 3)))
        with pytest.raises(BadRequestError, match="'x'"):
            client.predict(req)


def test_a_pickle_step_needs_the_operator_s_model_folders(tmp_path: Path, models: dict[str, Path]) -> None:
    """Without gateway.model_dirs the gateway does not start: loading the step's pickle would
    run its code, as a sklearn service's would."""
    try:
        proc = GatewayProcess.start({"services": [pipeline(models)]}, tmp_path / "no-dirs")
    except RuntimeError as exc:
        assert "pipeline.steps[0].model: a sklearn model is a pickle" in str(exc)
    else:
        proc.kill()
        pytest.fail("the gateway started, loading a pickle from no folder the operator named")
