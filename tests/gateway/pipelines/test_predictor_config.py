"""A model step's ``predictor``: another server by URL (gateway.config.pipelines); what is
accepted and what is refused, naming the step and the field."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config.pipelines import PipelineConfigError, parse_pipeline


def _block(predictor: Any, **step: Any) -> dict[str, Any]:
    return {
        "inputs": {"x": "float32"},
        "steps": [
            {"name": "p", "predictor": predictor, "inputs": {"x": "request.x"}, "outputs": ["y"], **step}
        ],
        "outputs": {"y": "p.y"},
    }


def test_a_predictor_step_is_a_model_step_with_its_defaults() -> None:
    spec = parse_pipeline(_block({"url": "http://10.0.0.7:8080/", "model": "m", "token": "t0ken"}), "svc")
    p = spec.steps[0].predictor
    assert p is not None and spec.steps[0].kind == "model"
    assert (p.url, p.model, p.protocol, p.timeout_ms, p.retries) == ("http://10.0.0.7:8080", "m", "v2", 0, 0)
    assert "t0ken" not in repr(p) and p.label == "predictor 'm' at http://10.0.0.7:8080 (v2)"
    grpc = parse_pipeline(_block({"url": "grpc://h:8001", "model": "m", "protocol": "grpc"}), "svc")
    assert grpc.steps[0].predictor is not None and grpc.steps[0].predictor.protocol == "grpc"


@pytest.mark.parametrize(
    ("predictor", "step", "message"),
    [
        (
            {"url": "http://h", "model": "m", "protocol": "v3"},
            {},
            "predictor.protocol: expected one of v1, v2, grpc",
        ),
        ({"model": "m"}, {}, "predictor.url: required"),
        ({"url": "h:80", "model": "m"}, {}, "a v2 predictor is http://host:port"),
        ({"url": "http://h:1", "model": "m", "protocol": "grpc"}, {}, "a grpc predictor is host:port"),
        (
            {"url": "http://h", "model": "m", "retries": 11},
            {},
            "predictor.retries: expected an integer from 0 to 10",
        ),
        ({"url": "http://h", "model": "m", "tls": True}, {}, "unknown key(s) tls"),
        (
            {"url": "http://h", "model": "m"},
            {"service": "s"},
            "a step calls a predictor, a service or its own model",
        ),
        ("http://h", {}, "predictor: expected a mapping with url and model"),
    ],
)
def test_a_predictor_that_cannot_be_called_is_refused(
    predictor: Any, step: dict[str, Any], message: str
) -> None:
    with pytest.raises(PipelineConfigError) as info:
        parse_pipeline(_block(predictor, **step), "svc")
    assert message in str(info.value) and "steps[0] (p)" in str(info.value)
