"""A pipeline's config block: what loads, and every error naming the step and the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gateway.config import ConfigError, parse_config
from gateway.config.pipelines import REQUEST

HERE = Path(__file__).resolve().parent
OPS = f"{HERE / 'fixture_ops.py'}"


def _config(pipeline: dict[str, Any], extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "services": [
            *(extra or []),
            {"name": "p", "processor": "pipeline", "public": True, "pipeline": pipeline},
        ]
    }


BASE: dict[str, Any] = {
    "inputs": {"x": {"dtype": "float32", "shape": [-1, 4]}},
    "steps": [
        {"name": "a", "op": f"{OPS}:Scale", "inputs": {"x": "request.x"}, "outputs": {"y": "float32"}},
        {"name": "b", "op": f"{OPS}:Scale", "inputs": {"x": "request.x"}, "outputs": {"y": "float32"}},
        {"name": "join", "transform": "concat", "inputs": {"l": "a.y", "r": "b.y"}, "outputs": ["y"]},
    ],
    "outputs": {"y": "join.y"},
}


def _with(**changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    out.update(changes)
    return out


def _error(pipeline: dict[str, Any], extra: list[dict[str, Any]] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(_config(pipeline, extra))
    return str(info.value)


def test_a_fan_out_fan_in_graph_loads_in_dependency_order() -> None:
    spec = parse_config(_config(BASE)).services[0].pipeline
    assert spec is not None
    assert [s.name for s in spec.steps] == ["a", "b", "join"]
    assert spec.step("join").deps == ("a", "b")
    assert spec.step("a").inputs[0].source.step == REQUEST
    assert spec.dtype_of(spec.outputs[0][1]) is None  # concat follows its inputs: undeclared


def test_steps_are_ordered_by_their_inputs_not_by_the_file() -> None:
    steps = copy.deepcopy(BASE["steps"])
    spec = parse_config(_config(_with(steps=[steps[2], steps[1], steps[0]]))).services[0].pipeline
    assert spec is not None
    assert [s.name for s in spec.steps][-1] == "join"


def test_an_unknown_step_is_named_with_the_field() -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps[2]["inputs"]["r"] = "bb.y"
    msg = _error(_with(steps=steps))
    assert "steps[2] (join).inputs.r" in msg and "unknown step 'bb'" in msg


def test_an_unknown_output_of_a_known_step() -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps[2]["inputs"]["r"] = "b.z"
    msg = _error(_with(steps=steps))
    assert "steps[2] (join).inputs.r" in msg and "step 'b' has no output 'z'" in msg


def test_a_cycle_is_spelled_out() -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps[0]["inputs"]["x"] = "join.y"
    steps[2]["outputs"] = ["y"]
    msg = _error(_with(steps=steps))
    assert "cycle: a -> join -> a" in msg or "cycle: join -> a -> join" in msg
    assert "pipeline.steps[" in msg


def test_a_missing_request_input() -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps[1]["inputs"]["x"] = "request.nope"
    msg = _error(_with(steps=steps))
    assert "steps[1] (b).inputs.x" in msg and "no request input 'nope'" in msg


def test_a_transform_missing_its_input() -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps.append({"name": "top", "transform": "topk", "inputs": {"scores": "join.y"}, "outputs": ["indices"]})
    msg = _error(_with(steps=steps, outputs={"i": "top.indices"}))
    assert "steps[3] (top).inputs" in msg and "missing input 'x'" in msg


def test_a_mistyped_input_names_both_sides() -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps[2]["inputs"]["r"] = {"from": "b.y", "dtype": "int64"}
    msg = _error(_with(steps=steps))
    assert "steps[2] (join).inputs.r" in msg and "expects INT64, but b.y is FP32" in msg


def test_a_transform_output_type_is_known_to_the_check() -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps.append({"name": "top", "transform": "topk", "inputs": {"x": "join.y"}, "outputs": ["indices"]})
    typed = {"x": {"from": "top.indices", "dtype": "float32"}}
    steps.append({"name": "c", "op": f"{OPS}:Scale", "inputs": typed, "outputs": ["y"]})
    msg = _error(_with(steps=steps, outputs={"y": "c.y", "j": "join.y"}))
    assert "steps[4] (c).inputs.x" in msg and "top.indices is INT64" in msg


def test_an_unused_step_output() -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps[0]["outputs"] = {"y": "float32", "extra": "float32"}
    msg = _error(_with(steps=steps))
    assert "steps[0] (a).outputs.extra" in msg and "never used" in msg


def test_an_unused_request_input() -> None:
    msg = _error(_with(inputs={"x": "float32", "spare": "float32"}))
    assert "pipeline.inputs.spare" in msg and "never used" in msg


def test_a_duplicate_step() -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps[1]["name"] = "a"
    assert "steps[1].name: step 'a' is declared twice" in _error(_with(steps=steps))


def test_a_step_referencing_an_unknown_service() -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps[0] = {"name": "a", "service": "ghost", "inputs": {"x": "request.x"}, "outputs": ["y"]}
    msg = _error(_with(steps=steps))
    assert "(a).service" in msg and "unknown service 'ghost'" in msg


def test_a_model_step_calls_an_onnx_or_a_python_service(tmp_path: Path) -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps[0] = {"name": "a", "service": "q", "inputs": {"x": "request.x"}, "outputs": ["y"]}
    msg = _error(_with(steps=steps), [{"name": "q", "processor": "queue", "public": True}])
    assert "services (p).pipeline.steps (a).service: service 'q' is a queue service (a queue" in msg
    assert msg.endswith(
        "a model step calls a service whose processor is one of "
        "onnx, sklearn, xgboost, lightgbm, torch, tensorflow, pmml, python"
    )
    # Another pipeline is no model step either ...
    other = {"name": "q", "processor": "pipeline", "public": True, "pipeline": copy.deepcopy(BASE)}
    msg = _error(_with(steps=steps), [other])
    assert "(a).service: service 'q' is a pipeline service (a step cannot be a whole pipeline" in msg
    # ... but a user's Python processor is (the KServe transformer -> predictor pattern).
    predictor = {"name": "q", "processor": "python", "public": True, "entry": f"{tmp_path / 'p.py'}:P"}
    (tmp_path / "p.py").write_text("class P:\n    def process(self, data):\n        return data\n")
    config = parse_config(_config(_with(steps=steps), [predictor]))
    spec = config.services[1].pipeline
    assert spec is not None and spec.step("a").service == "q"


def test_file_paths_are_checked() -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps[0]["op"] = "missing_ops.py:Nope"
    assert "steps[0] (a).op: file not found" in _error(_with(steps=steps))
    steps = copy.deepcopy(BASE["steps"])
    steps[0] = {"name": "a", "model": "missing.onnx", "inputs": {"x": "request.x"}, "outputs": ["y"]}
    assert "steps[0] (a).model: file not found" in _error(_with(steps=steps))


@pytest.mark.parametrize(
    ("step", "needle"),
    [
        ({"transform": "nope"}, "unknown transform 'nope'"),
        ({"transform": "topk", "args": {"k": 0}, "outputs": ["indices"]}, "args.k: expected an integer"),
        ({"transform": "topk", "args": {"n": 1}, "outputs": ["indices"]}, "unknown arg(s) n"),
        ({"transform": "label_map", "outputs": ["label"]}, "args.labels: expected a non-empty list"),
        ({"transform": "topk", "op": "x.py:X"}, "transform step has no op"),
        ({}, "a step needs one of: service, model, predictor, op, transform"),
        ({"transform": "argmax", "outputs": ["y"]}, "outputs.y: argmax produces only index"),
        ({"transform": "argmax", "concurrency": -1}, "concurrency: expected an integer"),
        ({"transform": "argmax", "colour": "red"}, "unknown key(s) colour"),
    ],
)
def test_step_field_errors(step: dict[str, Any], needle: str) -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps.append({"name": "t", "inputs": {"x": "join.y"}, "outputs": ["index"], **step})
    out = step.get("outputs", ["index"])[0]
    msg = _error(_with(steps=steps, outputs={"y": "join.y", "t": f"t.{out}"}))
    assert needle in msg and "steps[3] (t)" in msg, msg


def test_only_a_pipeline_service_has_a_pipeline() -> None:
    with pytest.raises(ConfigError, match="only a service with processor: pipeline"):
        parse_config(
            {
                "services": [
                    {
                        "name": "e",
                        "processor": "python",
                        "public": True,
                        "entry": f"{OPS}:Scale",
                        "pipeline": {},
                    }
                ]
            }
        )


def test_placement_is_checked() -> None:
    steps = copy.deepcopy(BASE["steps"])
    steps[0]["placement"] = "process"  # an op alone: on worker processes of its own
    spec = parse_config(_config(_with(steps=steps))).services[0].pipeline
    assert spec is not None and spec.step("a").placement == "process" and spec.step("b").placement == "thread"
    steps[2]["placement"] = "thread"
    assert "steps[2] (join).placement: a service step runs on its workers" in _error(_with(steps=steps))
    steps = copy.deepcopy(BASE["steps"])
    steps[0] = {"name": "a", "service": "m", "op": f"{OPS}:Scale", "placement": "process",
                "inputs": {"x": "request.x"}, "outputs": ["y"]}  # fmt: skip
    assert "steps[0] (a).placement: an op around a service runs in" in _error(_with(steps=steps))
    steps[0]["placement"] = "gpu"
    assert "steps[0] (a).placement: expected process or thread, got 'gpu'" in _error(_with(steps=steps))
