"""A model step's own ``model`` may be a URL, as a service's may (gateway.config.pipelines):
what is accepted and what is refused, naming the step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.config import ConfigError
from gateway.config.pipelines import parse_pipeline


def _block(model: str, **step: Any) -> dict[str, Any]:
    return {
        "inputs": {"x": "float32"},
        "steps": [{"name": "m", "model": model, "inputs": {"x": "request.x"}, "outputs": ["y"], **step}],
        "outputs": {"y": "m.y"},
    }


@pytest.mark.parametrize("placement", ["process", "thread"])
def test_a_step_model_may_be_a_url(placement: str) -> None:
    for url in ("s3://models/steps/m.onnx", "oss://models/m.onnx", "https://h.example/m.onnx"):
        spec = parse_pipeline(_block(url, placement=placement), "svc")
        assert spec.steps[0].model == url and spec.steps[0].placement == placement


def test_a_file_url_is_its_path(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    assert parse_pipeline(_block(model.as_uri()), "svc").steps[0].model == str(model)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "s3://AKIAKEY:s3cr3t@models/m.onnx",
            "steps[0] (m).model: s3://models/m.onnx: credentials do not belong",
        ),
        ("s3://models/", "steps[0] (m).model: s3://models/: expected s3://bucket/key naming one object"),
        ("ftp://h/m.onnx", "steps[0] (m).model: ftp://h/m.onnx: expected one of s3://"),
    ],
)
def test_a_bad_step_model_url_is_refused(url: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_pipeline(_block(url), "svc")
    assert message in str(caught.value), caught.value
    assert "s3cr3t" not in str(caught.value) and "AKIAKEY" not in str(caught.value)


def test_model_dirs_hold_a_steps_model_as_a_services(tmp_path: Path) -> None:
    from gateway.config import parse_config

    inside, outside = tmp_path / "models", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    (outside / "m.onnx").write_bytes(b"x")

    def config(model: str) -> dict[str, Any]:
        gateway = {
            "model_dirs": [str(inside)],
            "model_sources": [{"prefix": "s3://models/", "endpoint": "http://127.0.0.1:9"}],
        }
        pipeline = {"name": "p", "processor": "pipeline", "public": True, "pipeline": _block(model)}
        return {"gateway": gateway, "services": [pipeline]}

    assert parse_config(config("s3://models/m.onnx")).services[0].pipeline is not None
    with pytest.raises(
        ConfigError, match=r"pipeline\.steps\[0\]\.model: with gateway\.model_dirs set, a model URL"
    ):
        parse_config(config("s3://other/m.onnx"))
    with pytest.raises(
        ConfigError, match=r"pipeline\.steps\[0\]\.model: m\.onnx is outside the model directories"
    ):
        parse_config(config(str(outside / "m.onnx")))
