"""A pipeline backend in process: real ops and transforms, requests in the EAS JSON and TF
forms, concurrency of branches and steps, failures that name their step."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eas_sdk.codecs.eas import decode_tf_response, encode_tf_request
from gateway.backends.pipelines.backend import PipelineBackend, step_service
from gateway.backends.pipelines.timings import TIMINGS_HEADER, StepTimings
from gateway.backends.threads import ThreadService
from gateway.config import ConfigError, GatewayConfig, ServiceConfig, parse_config
from gateway.core import errors
from gateway.core.calls import WorkerRequest
from tests.gateway.front.fakes import FakePool
from tests.waiting import async_wait_until

OPS = f"{Path(__file__).resolve().parent / 'fixture_ops.py'}"


def _op(name: str, cls: str, x: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "op": f"{OPS}:{cls}", "inputs": {"x": x}, "outputs": {"y": "float32"}, **extra}


SERVICES: list[dict[str, Any]] = [
    {   # fan-out to two branches that must run side by side, fan-in with concat, a transform
        "name": "diamond",
        "processor": "pipeline", "public": True,
        "pipeline": {
            "inputs": {"x": {"dtype": "float32", "shape": [-1, 2]}},
            "steps": [
                _op("left", "Meet", "request.x", config={"party": "diamond"}),
                _op("right", "Meet", "request.x", config={"party": "diamond"}),
                _op("double", "Scale", "right.y", config={"factor": 2}),
                {"name": "join", "transform": "concat", "inputs": {"a": "left.y", "b": "double.y"},
                 "outputs": ["y"]},
                {"name": "top", "transform": "topk", "args": {"k": 1}, "inputs": {"x": "join.y"},
                 "outputs": ["indices"]},
            ],
            "outputs": {"joined": "join.y", "best": "top.indices"},
        },
    },
    {   # one step the tests hold while they look (Hold), two threads
        "name": "slow",
        "processor": "pipeline", "public": True,
        "pipeline": {
            "inputs": {"x": "float32"},
            "steps": [_op("wait", "Hold", "request.x", concurrency=2)],
            "outputs": {"y": "wait.y"},
        },
    },
    {
        "name": "fast",
        "processor": "pipeline", "public": True,
        "pipeline": {
            "inputs": {"x": "float32"},
            "steps": [_op("scale", "Scale", "request.x", config={"factor": 3})],
            "outputs": {"y": "scale.y"},
        },
    },
    {
        "name": "guarded",
        "processor": "pipeline", "public": True,
        "pipeline": {
            "inputs": {"x": "float32"},
            "steps": [
                _op("check", "FailOnNegative", "request.x"),
                {"name": "whole", "transform": "cast", "args": {"dtype": "int64"}, "inputs": {"x": "check.y"},
                 "outputs": ["y"]},
                {"name": "names", "transform": "label_map", "args": {"labels": ["a", "b"]},
                 "inputs": {"x": {"from": "whole.y", "dtype": "int64"}}, "outputs": ["label"]},
            ],
            "outputs": {"label": "names.label"},
        },
    },
]  # fmt: skip


@pytest.fixture
async def backends() -> Any:
    config = parse_config({"services": SERVICES})
    timings = StepTimings()
    out = {
        s.name: PipelineBackend(s, GatewayConfig(), {}, pool_factory=lambda *a: None, timings=timings)
        for s in config.services
    }
    for b in out.values():
        await b.start()
    yield out
    for b in out.values():
        await b.stop(0.0)


def _json(inputs: dict[str, Any], **headers: str) -> WorkerRequest:
    body = json.dumps({"inputs": inputs}).encode()
    return WorkerRequest(body, "", "application/json", "rid-1", dict(headers), 0.0)


async def _call(backend: PipelineBackend, inputs: dict[str, Any], **headers: str) -> tuple[int, Any]:
    resp = await backend.dispatch(_json(inputs, **headers), 5.0)
    return resp.status, json.loads(resp.body)


async def test_branches_run_concurrently_and_join(backends: dict[str, PipelineBackend]) -> None:
    # Each branch waits until the other one runs too: run one after the other, they fail.
    status, body = await _call(backends["diamond"], {"x": [[1.0, 5.0]]})
    assert status == 200, body
    assert body["outputs"]["joined"]["data"] == [1.0, 5.0, 2.0, 10.0]
    assert body["outputs"]["best"]["data"] == [3]


async def test_a_step_runs_as_many_at_once_as_its_concurrency(backends: dict[str, PipelineBackend]) -> None:
    slow = backends["slow"]
    op = slow._ops[0].op
    op.hold()
    try:
        calls = [asyncio.ensure_future(_call(slow, {"x": [float(i)]})) for i in range(4)]
        await async_wait_until(lambda: op.running == 2, 10, "two runs of the step at once")
        assert not any(c.done() for c in calls)  # the other two wait for a thread
    finally:
        op.release()
    results = await asyncio.gather(*calls)
    assert [r[1]["outputs"]["y"]["data"] for r in results] == [[0.0], [1.0], [2.0], [3.0]]
    assert op.most == 2  # never more than its two threads


async def test_a_busy_slow_step_does_not_hold_up_a_fast_one(backends: dict[str, PipelineBackend]) -> None:
    op = backends["slow"]._ops[0].op
    op.hold()
    try:
        backlog = [asyncio.ensure_future(_call(backends["slow"], {"x": [1.0]})) for _ in range(6)]
        await async_wait_until(lambda: op.running == 2, 10, "the slow step's threads busy")
        # Answered while every thread of the slow step is held and four calls wait for one.
        status, body = await _call(backends["fast"], {"x": [2.0]})
        assert status == 200 and body["outputs"]["y"]["data"] == [6.0]
        assert not any(t.done() for t in backlog)
    finally:
        op.release()
    await asyncio.gather(*backlog)


async def test_a_failing_step_is_named_with_its_status(backends: dict[str, PipelineBackend]) -> None:
    guarded = backends["guarded"]
    status, body = await _call(guarded, {"x": [-1.0]})
    assert status == 422
    assert body["code"] == "PipelineStepFailed" and body["request_id"] == "rid-1"
    assert body["message"] == "step 'check': x must not be negative"
    status, body = await _call(guarded, {"x": [101.0]})
    assert status == 500 and body["message"] == "step 'check': RuntimeError: cannot handle values over 100"
    # A transform failing on what an op gave it names the transform.
    status, body = await _call(guarded, {"x": [7.0]})
    assert status == 500 and body["message"].startswith("step 'names': label index out of range")
    # The next request is served as usual.
    status, body = await _call(guarded, {"x": [1.0]})
    assert status == 200 and body["outputs"]["label"]["data"] == ["b"]


async def test_bad_requests_get_the_codec_s_400(backends: dict[str, PipelineBackend]) -> None:
    status, body = await _call(backends["fast"], {"z": [1.0]})
    assert status == 400 and "unknown input 'z'" in body["message"]
    status, body = await _call(backends["diamond"], {"x": [1.0, 2.0, 3.0]})
    assert status == 400 and "input 'x': expected float32[-1,2]" in body["message"]


async def test_a_tf_request_is_answered_in_tf(backends: dict[str, PipelineBackend]) -> None:
    body = encode_tf_request("serving_default", {"x": np.array([[1, 2]], dtype=np.float32)}, ["best"])
    resp = await backends["diamond"].dispatch(WorkerRequest(body, "", "application/octet-stream", "r"), 5.0)
    assert resp.status == 200
    out = decode_tf_response(resp.body)
    assert list(out) == ["best"]
    assert out["best"].to_tensor("best").array.tolist() == [[3]]


async def test_timings_come_back_when_asked_and_feed_the_histogram(
    backends: dict[str, PipelineBackend],
) -> None:
    resp = await backends["diamond"].dispatch(_json({"x": [[1.0, 2.0]]}), 5.0)
    assert resp.headers is None
    resp = await backends["diamond"].dispatch(_json({"x": [[1.0, 2.0]]}, **{TIMINGS_HEADER: "1"}), 5.0)
    timing = (resp.headers or {})["Server-Timing"]
    steps = [part.split(";")[0] for part in timing.split(", ")]
    assert steps[-1] == "total" and set(steps[:-1]) == {"left", "right", "double", "join", "top"}
    family = next(iter(backends["diamond"].timings.collect()))
    counts = {
        s.labels["step"]: s.value
        for s in family.samples
        if s.name.endswith("_count") and s.labels["service"] == "diamond"
    }
    assert counts == {"left": 2, "right": 2, "double": 2, "join": 2, "top": 2}


async def test_an_op_that_cannot_load_fails_the_start_naming_the_step(tmp_path: Path) -> None:
    bad = tmp_path / "bad_ops.py"
    bad.write_text("raise ImportError('no such library')\n")
    svc = parse_config(
        {
            "services": [
                {
                    "name": "p",
                    "processor": "pipeline",
                    "public": True,
                    "pipeline": {
                        "inputs": {"x": "float32"},
                        "steps": [
                            {"name": "load", "op": f"{bad}:X", "inputs": {"x": "request.x"}, "outputs": ["y"]}
                        ],
                        "outputs": {"y": "load.y"},
                    },
                }
            ]
        }
    ).services[0]
    backend = PipelineBackend(svc, GatewayConfig(), {}, pool_factory=lambda *a: None)
    with pytest.raises(ConfigError, match=r"step 'load': cannot load op .*no such library"):
        await backend.start()


def _double_model(path: Path) -> Path:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


async def test_a_model_in_the_gateway_s_threads(tmp_path: Path) -> None:
    model = _double_model(tmp_path / "double.onnx")
    raw = {"name": "local", "processor": "pipeline", "public": True, "pipeline": {
        "inputs": {"x": "float64"},  # an op's float64 is cast to the model's float32
        "steps": [
            {"name": "twice", "model": str(model), "placement": "thread", "concurrency": 2,
             "inputs": {"x": "request.x"}, "outputs": ["y"]},
            {"name": "again", "op": f"{OPS}:AroundModel", "model": str(model), "placement": "thread",
             "inputs": {"x": "twice.y"}, "outputs": ["y"]},
        ],
        "outputs": {"y": "again.y"}}}  # fmt: skip
    svc = parse_config({"services": [raw]}).services[0]
    backend = PipelineBackend(svc, GatewayConfig(), {}, pool_factory=lambda *a: pytest.fail("no pool"))
    await backend.start()
    try:
        assert backend.is_ready() and backend.snapshot() == []
        status, body = await _call(backend, {"x": [[1.0, 2.0]]})
        # twice: 2, 4; again: op doubles (4, 8), the model doubles (8, 16), the op adds 1.
        assert status == 200 and body["outputs"]["y"]["data"] == [9.0, 17.0]
        status, body = await _call(backend, {"x": [[1.0, 2.0, 3.0]]})
        assert status == 400 and body["message"].startswith("step 'twice': model run failed")
    finally:
        await backend.stop(0.0)


def _chain(tmp_path: Path) -> tuple[ServiceConfig, ServiceConfig]:
    """A service run in the gateway's threads (``doubler``), and a pipeline whose one step
    (``twice``) calls it."""
    model = _double_model(tmp_path / "double.onnx")
    doubler = {
        "name": "doubler",
        "processor": "onnx",
        "public": True,
        "model": str(model),
        "placement": "thread",
    }
    raw = {"name": "chain", "processor": "pipeline", "public": True, "pipeline": {
        "inputs": {"x": "float32"},
        "steps": [{"name": "twice", "service": "doubler", "inputs": {"x": "request.x"}, "outputs": ["y"]}],
        "outputs": {"y": "twice.y"}}}  # fmt: skip
    svc, pipe = parse_config({"services": [doubler, raw]}).services
    return svc, pipe


async def test_a_step_calls_a_service_that_runs_in_the_gateway_s_threads(tmp_path: Path) -> None:
    svc, pipe = _chain(tmp_path)
    threads = ThreadService(svc, GatewayConfig())
    backend = PipelineBackend(pipe, GatewayConfig(), {"doubler": threads}, pool_factory=lambda *a: None)
    await threads.start()
    await backend.start()
    try:
        assert await backend.wait_ready(30.0)
        # Ready as its step's service is, which has no worker endpoints of its own.
        assert backend.is_ready() and threads.ready_endpoints() == []
        status, body = await _call(backend, {"x": [[1.0, 2.0]]})
        assert status == 200 and body["outputs"]["y"]["data"] == [2.0, 4.0]
    finally:
        await backend.stop(0.0)
        await threads.stop(0.0)
    assert not backend.is_ready()


async def test_a_pipeline_names_the_step_that_keeps_it_from_being_ready(tmp_path: Path) -> None:
    svc, pipe = _chain(tmp_path)
    step_pool = FakePool(svc, GatewayConfig(), ready=False)  # its workers still starting
    backend = PipelineBackend(pipe, GatewayConfig(), {"doubler": step_pool}, pool_factory=FakePool)
    assert backend.not_ready_reason() == "the pipeline is not started"
    await backend.start()
    try:
        assert not backend.is_ready()
        assert backend.not_ready_reason() == "step twice: it has no ready worker"
        step_pool.ready = True
        assert backend.is_ready() and backend.not_ready_reason() is None
        with pytest.raises(errors.BadRequest, match="pipeline service: it has no workers"):
            await backend.scale(2, 0.0)  # its workers are its steps'
    finally:
        await backend.stop(0.0)


async def test_calls_in_flight_are_counted_until_answered(backends: dict[str, PipelineBackend]) -> None:
    """``pending``: the pipeline's calls in flight, as the service manager lists them."""
    slow = backends["slow"]
    op = slow._ops[0].op
    op.hold()
    try:
        calls = [asyncio.ensure_future(_call(slow, {"x": [1.0]})) for _ in range(3)]
        await async_wait_until(lambda: slow.pending == 3, 10, "three calls in flight")
    finally:
        op.release()
    await asyncio.gather(*calls)
    assert slow.pending == 0


async def test_a_model_s_names_are_checked_when_it_loads(tmp_path: Path) -> None:
    model = _double_model(tmp_path / "double.onnx")

    def service(inputs: dict[str, str], outputs: list[str]) -> Any:
        step = {"name": "m", "model": str(model), "placement": "thread", "inputs": inputs, "outputs": outputs}
        pipeline = {"inputs": {"x": "float32"}, "steps": [step], "outputs": {o: f"m.{o}" for o in outputs}}
        return parse_config(
            {"services": [{"name": "p", "processor": "pipeline", "public": True, "pipeline": pipeline}]}
        ).services[0]

    for svc, needle in (
        (service({"z": "request.x"}, ["y"]), "inputs.z: the model has no input 'z'; its inputs: x"),
        (service({"x": "request.x"}, ["w"]), "outputs.w: the model has no output 'w'; its outputs: y"),
    ):
        backend = PipelineBackend(svc, GatewayConfig(), {}, pool_factory=lambda *a: None)
        with pytest.raises(
            ConfigError, match=re.escape(f"step 'm': cannot load model {str(model)!r}: {needle}")
        ):
            await backend.start()


async def test_a_run_past_its_time_is_a_504_naming_the_running_step(
    backends: dict[str, PipelineBackend],
) -> None:
    op = backends["slow"]._ops[0].op
    op.hold()
    try:
        resp = await backends["slow"].dispatch(_json({"x": [1.0]}), 0.05)
    finally:
        op.release()
    body = json.loads(resp.body)
    assert resp.status == 504 and body["code"] == "UpstreamTimeout"
    assert body["message"] == "the pipeline did not finish within 0.05 s (steps still running: wait)"
    status, _ = await _call(backends["slow"], {"x": [1.0]})  # the next one has its time
    assert status == 200


async def test_metadata_types_follow_the_graph(backends: dict[str, PipelineBackend]) -> None:
    meta = backends["diamond"].metadata
    assert [(t.name, t.datatype, t.shape) for t in meta.inputs] == [("x", "FP32", (-1, 2))]
    # concat of two float32 outputs is float32; topk's indices are int64.
    assert [(t.name, t.datatype) for t in meta.outputs] == [("joined", "FP32"), ("best", "INT64")]
    assert [(t.name, t.datatype) for t in backends["guarded"].metadata.outputs] == [("label", "BYTES")]


def test_a_steps_own_workers_take_the_pipelines_tokens() -> None:
    """The gateway calls a step's workers over the IPC (no token); their direct HTTP port
    wants the pipeline's token, so it is no way around the pipeline's."""
    pipeline = {
        "inputs": {"x": "float32"},
        "steps": [{**_op("work", "Scale", "request.x"), "placement": "process"}],
        "outputs": {"y": "work.y"},
    }
    raw = {"name": "p", "processor": "pipeline", "token": "a-pipeline-token-0123456789", "pipeline": pipeline}
    svc = parse_config({"services": [raw]}).services[0]
    assert svc.pipeline is not None
    hidden = step_service(svc, svc.pipeline.steps[0], {"EXTRA": "1"})
    assert hidden.name == "p.work" and hidden.processor == "op"
    assert hidden.tokens == ("a-pipeline-token-0123456789",) and not hidden.public
    assert hidden.env["EXTRA"] == "1"
