"""A model step's own model in any of the model runtimes (gateway.config.pipelines): its
runtime by the file's suffix or folder, as ``serve --model`` picks one, or by ``processor:``;
what is refused, naming the step; a pickle step held to the operator's model folders; and
the hidden service that runs it, on worker processes or in the gateway's threads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.backends.pipelines.backend import step_service
from gateway.config import ConfigError, parse_config
from gateway.config.pipelines import parse_pipeline


def _block(model: str, **step: Any) -> dict[str, Any]:
    return {
        "inputs": {"x": "float32"},
        "steps": [{"name": "m", "model": model, "inputs": {"x": "request.x"}, "outputs": ["y"], **step}],
        "outputs": {"y": "m.y"},
    }


@pytest.mark.parametrize(
    ("name", "runtime"),
    [
        ("m.onnx", "onnx"),
        ("m.joblib", "sklearn"),
        ("m.pkl", "sklearn"),
        ("m.json", "xgboost"),
        ("m.ubj", "xgboost"),
        ("m.txt", "lightgbm"),
        ("m.pt", "torch"),
        ("m.pmml", "pmml"),
        ("m.bin", "onnx"),  # a suffix that names no runtime: ONNX, as a step's model always was
    ],
)
def test_a_step_s_runtime_is_its_file_s(tmp_path: Path, name: str, runtime: str) -> None:
    (tmp_path / name).write_bytes(b"x")
    step = parse_pipeline(_block(str(tmp_path / name)), "svc").steps[0]
    assert (step.processor, step.model) == (runtime, str(tmp_path / name))


def test_a_saved_model_folder_is_tensorflow(tmp_path: Path) -> None:
    (tmp_path / "saved" / "variables").mkdir(parents=True)
    (tmp_path / "saved" / "saved_model.pb").write_bytes(b"x")
    step = parse_pipeline(_block(str(tmp_path / "saved")), "svc").steps[0]
    assert (step.processor, step.model) == ("tensorflow", str(tmp_path / "saved"))


def test_processor_names_the_runtime_whatever_the_name(tmp_path: Path) -> None:
    (tmp_path / "m.model").write_bytes(b"x")
    (tmp_path / "m.onnx").write_bytes(b"x")
    assert (
        parse_pipeline(_block(str(tmp_path / "m.model"), processor="xgboost"), "s").steps[0].processor
        == "xgboost"
    )
    # Given, it wins over the suffix.
    assert (
        parse_pipeline(_block(str(tmp_path / "m.onnx"), processor="lightgbm"), "s").steps[0].processor
        == "lightgbm"
    )


def test_a_url_s_runtime_is_its_path_s() -> None:
    assert parse_pipeline(_block("s3://models/iris.joblib"), "s").steps[0].processor == "sklearn"
    assert parse_pipeline(_block("https://h.example/m", processor="pmml"), "s").steps[0].processor == "pmml"


@pytest.mark.parametrize(
    ("make", "step", "message"),
    [
        ("m.onnx", {"processor": "python"}, "steps[0] (m).processor: expected one of onnx, sklearn, xgboost"),
        ("m.onnx", {"processor": "queue"}, "got 'queue'"),
        ("folder", {"processor": "tensorflow"}, "steps[0] (m).model: not a folder holding saved_model.pb"),
        ("folder", {}, "steps[0] (m).model: not a file"),  # no marker: not a SavedModel, and no file
        ("missing.pt", {}, "steps[0] (m).model: file not found"),
    ],
)
def test_a_step_s_runtime_that_cannot_be_is_refused(
    tmp_path: Path, make: str, step: dict[str, Any], message: str
) -> None:
    path = tmp_path / make
    if make == "folder":
        path.mkdir()
    elif make != "missing.pt":
        path.write_bytes(b"x")
    with pytest.raises(ConfigError) as caught:
        parse_pipeline(_block(str(path), **step), "svc")
    assert message in str(caught.value), caught.value


def test_only_a_step_with_its_own_model_names_a_runtime() -> None:
    block = {
        "inputs": {"x": "float32"},
        "steps": [{"name": "t", "transform": "softmax", "processor": "onnx", "inputs": {"x": "request.x"},
                   "outputs": ["y"]}],
        "outputs": {"y": "t.y"},
    }  # fmt: skip
    with pytest.raises(ConfigError, match=r"steps\[0\] \(t\)\.processor: only a step with its own model"):
        parse_pipeline(block, "svc")


def _service(model: Path, **step: Any) -> dict[str, Any]:
    return {"name": "p", "processor": "pipeline", "public": True, "pipeline": _block(str(model), **step)}


def test_a_pickle_step_loads_only_from_the_model_dirs(tmp_path: Path) -> None:
    inside, outside = tmp_path / "models", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    for folder in (inside, outside):
        (folder / "m.joblib").write_bytes(b"x")
    with pytest.raises(ConfigError) as caught:
        parse_config({"services": [_service(inside / "m.joblib")]})
    assert "services[0] (p).pipeline.steps[0].model: a sklearn model is a pickle" in str(caught.value)
    assert "gateway.model_dirs" in str(caught.value)
    with pytest.raises(
        ConfigError, match=r"pipeline\.steps\[0\]\.model: m\.joblib is outside the model directories"
    ):
        parse_config({"gateway": {"model_dirs": [str(inside)]}, "services": [_service(outside / "m.joblib")]})
    svc = parse_config(
        {"gateway": {"model_dirs": [str(inside)]}, "services": [_service(inside / "m.joblib")]}
    )
    assert svc.services[0].pipeline is not None
    assert svc.services[0].pipeline.steps[0].processor == "sklearn"
    # Only a pickle needs the folders: a LightGBM step's text file loads from anywhere.
    (outside / "m.txt").write_bytes(b"x")
    assert parse_config({"services": [_service(outside / "m.txt")]}).services[0].pipeline is not None


@pytest.mark.parametrize(
    ("step", "placement", "workers"),
    [
        ({}, "process", 1),
        ({"workers": 3}, "process", 3),
        ({"placement": "thread"}, "thread", 1),  # one thread, as an ONNX step's own model
        ({"placement": "thread", "concurrency": 2}, "thread", 2),
    ],
)
def test_the_hidden_service_runs_the_step_s_runtime_where_it_is_placed(
    tmp_path: Path, step: dict[str, Any], placement: str, workers: int
) -> None:
    (tmp_path / "m.txt").write_bytes(b"x")
    pipe = parse_config({"services": [_service(tmp_path / "m.txt", **step)]}).services[0]
    assert pipe.pipeline is not None
    hidden = step_service(pipe, pipe.pipeline.steps[0])
    assert (hidden.name, hidden.processor, hidden.model) == ("p.m", "lightgbm", str(tmp_path / "m.txt"))
    assert (hidden.placement, hidden.workers) == (placement, workers)
