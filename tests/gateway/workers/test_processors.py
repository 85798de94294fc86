"""Processors run in-process (no worker): onnx over every request format, python custom code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eas_sdk._proto import blade_pb2, tf_predict_pb2, torch_predict_pb2
from gateway.config import ServiceConfig
from gateway.core.calls import WorkerRequest
from gateway.worker.processors.base import LoadError, ProcessorError
from gateway.worker.processors.onnx import OnnxProcessor
from gateway.worker.processors.registry import create_processor
from tests.gateway.workers.conftest import ECHO_ENTRY, echo_service


@pytest.fixture(scope="module")
def digits(models: dict[str, Path]) -> OnnxProcessor:
    p = create_processor(ServiceConfig(name="digits", processor="onnx", model=str(models["digits"])))
    p.load()
    assert isinstance(p, OnnxProcessor)
    _DIGITS_SESSION[:] = [p.session]
    return p


@pytest.fixture(scope="module")
def multi(models: dict[str, Path]) -> OnnxProcessor:
    p = OnnxProcessor(ServiceConfig(name="multi", processor="onnx", model=str(models["multi"])))
    p.load()
    return p


def _digits_input() -> tuple[np.ndarray, np.ndarray]:
    """Four 8x8 "images" and the labels the model gives them (argmax of its probabilities)."""
    x = np.random.default_rng(7).random((4, 64), dtype=np.float32)
    session = _DIGITS_SESSION[0]
    labels = session.run(["probabilities"], {"input": x})[0].argmax(axis=1)
    return x, labels


_DIGITS_SESSION: list[Any] = []


def test_onnx_tf_request(digits: OnnxProcessor) -> None:
    x, y = _digits_input()
    req = tf_predict_pb2.PredictRequest(signature_name="predict")
    req.inputs["input"].dtype = tf_predict_pb2.DT_FLOAT
    req.inputs["input"].array_shape.dim.extend(x.shape)
    req.inputs["input"].float_val.extend(x.ravel().tolist())
    resp = digits.handle(WorkerRequest(req.SerializeToString()))
    assert resp.status == 200
    out = tf_predict_pb2.PredictResponse.FromString(resp.body)
    assert set(out.outputs) == {"label", "probabilities"}
    assert list(out.outputs["label"].int64_val) == y.tolist()
    assert list(out.outputs["probabilities"].array_shape.dim) == [4, 10]
    # output_filter selects.
    req.output_filter.append("label")
    resp = digits.handle(WorkerRequest(req.SerializeToString()))
    out = tf_predict_pb2.PredictResponse.FromString(resp.body)
    assert set(out.outputs) == {"label"}


def test_onnx_json_request_and_header_format(digits: OnnxProcessor) -> None:
    x, y = _digits_input()
    body = json.dumps({"inputs": {"input": x.tolist()}, "outputs": ["label"]}).encode()
    resp = digits.handle(WorkerRequest(body))
    assert resp.status == 200 and resp.content_type == "application/json"
    expected = {"outputs": {"label": {"dtype": "int64", "shape": [4], "data": y.tolist()}}}
    assert json.loads(resp.body) == expected
    with pytest.raises(ProcessorError, match="cannot decode request as tf"):
        digits.handle(WorkerRequest(body, headers={"x-eas-request-format": "tf"}))


def test_onnx_json_request_answered_in_the_tf_form_when_asked(digits: OnnxProcessor) -> None:
    """The gateway's adapters keep the JSON form's loose casting (ints for a float input)
    and read the answer as arrays: X-Eas-Response-Format: tf."""
    body = json.dumps({"inputs": {"input": [[0] * 64] * 4}}).encode()
    resp = digits.handle(WorkerRequest(body, headers={"X-Eas-Response-Format": "tf"}))
    assert resp.status == 200 and resp.content_type == "application/octet-stream"
    out = tf_predict_pb2.PredictResponse.FromString(resp.body)
    assert set(out.outputs) == {"label", "probabilities"}
    assert list(out.outputs["probabilities"].array_shape.dim) == [4, 10]


def test_onnx_dtype_and_shape_errors(digits: OnnxProcessor) -> None:
    req = tf_predict_pb2.PredictRequest(signature_name="predict")
    req.inputs["input"].dtype = tf_predict_pb2.DT_INT64
    req.inputs["input"].array_shape.dim.extend([3, 5])
    req.inputs["input"].int64_val.extend(range(15))
    with pytest.raises(ProcessorError) as exc:
        digits.handle(WorkerRequest(req.SerializeToString()))
    assert exc.value.status == 400
    assert exc.value.message == "input 'input': expected float32[N,64], got int64[3,5]"
    with pytest.raises(ProcessorError, match="cannot decode"):
        digits.handle(WorkerRequest(b"\xff\xfe\xfd"))


def test_onnx_torch_positional_and_blade(multi: OnnxProcessor) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = np.arange(8, dtype=np.int64).reshape(2, 4)
    z = np.full((2, 4), 0.5)
    req = torch_predict_pb2.PredictRequest()
    for arr, dt, field in (
        (x, torch_predict_pb2.DT_FLOAT, "float_val"),
        (y, torch_predict_pb2.DT_INT64, "int64_val"),
        (z, torch_predict_pb2.DT_DOUBLE, "double_val"),
    ):
        a = req.inputs.add()
        a.dtype = dt
        a.array_shape.dim.extend(arr.shape)
        getattr(a, field).extend(arr.ravel().tolist())
    req.output_filter.extend([3, 1])
    resp = multi.handle(WorkerRequest(req.SerializeToString()))
    out = torch_predict_pb2.PredictResponse.FromString(resp.body)
    # Filter order: mask (uint8 -> INT32 on the wire), then yy.
    assert out.outputs[0].dtype == torch_predict_pb2.DT_INT32
    assert list(out.outputs[0].int_val) == (y > 0).astype(int).ravel().tolist()
    assert list(out.outputs[1].int64_val) == (y * 2).ravel().tolist()
    # Inputs by position: swapping x and y is a dtype error naming the model input.
    req.inputs[0].CopyFrom(req.inputs[1])
    with pytest.raises(ProcessorError, match=r"input 'x': expected float32\[N,4\], got int64\[2,4\]"):
        multi.handle(WorkerRequest(req.SerializeToString()))

    blade = blade_pb2.Request(tf_signature_name="s")
    feeds = (("x", x, "float_val"), ("y", y.astype(np.int32), "int_val"), ("z", z, "float_val"))
    for name, arr, field in feeds:
        a = blade.inputs.add(name_in_dl_model=name, blade_blob_name=name, batchsize=2)
        a.shape.dim.extend(arr.shape)
        getattr(a, field).extend(arr.ravel().tolist())
    blade.output_info.add(name_in_dl_model=" sum ", data_type=blade_pb2.DT_FLOAT)
    resp = blade_pb2.Response.FromString(multi.handle(WorkerRequest(blade.SerializeToString())).body)
    assert [o.name_in_dl_model for o in resp.outputs] == ["sum"]
    assert resp.outputs[0].batchsize == 2 and list(resp.outputs[0].float_val) == (x + y).ravel().tolist()


def test_onnx_missing_model_fails_to_load(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a model")
    with pytest.raises(Exception, match=r"(?i)protobuf|invalid|load|parse"):
        OnnxProcessor(ServiceConfig(name="bad", processor="onnx", model=str(bad))).load()


def test_python_processor_echo_and_statuses() -> None:
    p = create_processor(echo_service(config={"greeting": "hi"}))
    p.load()
    assert p.handle(WorkerRequest(b"abc")).body == b"abc"
    r = p.handle(WorkerRequest(b"status:418:teapot"))
    assert (r.status, r.body) == (418, b"teapot")
    r = p.handle(WorkerRequest(b"sleep:0"))
    assert (r.status, r.body) == (200, b"slept 0")  # status 0 means 200
    assert json.loads(p.handle(WorkerRequest(b"config")).body) == {"greeting": "hi"}
    with pytest.raises(ProcessorError) as exc:
        p.handle(WorkerRequest(b"raise:boom"))
    assert exc.value.status == 400 and exc.value.message == "boom"
    # The instance survives an exception.
    assert p.handle(WorkerRequest(b"count")).body == b"6"


def test_python_processor_entry_forms(tmp_path: Path) -> None:
    mod = tmp_path / "procmod_h3.py"
    mod.write_text(
        "class P:\n"
        "    def initialize(self):\n        self.n = len(self.config)\n"
        "    def process(self, data):\n"
        "        return b'%d:%s' % (self.n, str(self.get_model_path()).encode()), 0\n"
    )
    p = create_processor(echo_service(entry=f"{mod}:P", config={"a": 1}, model=str(tmp_path)))
    p.load()
    r = p.handle(WorkerRequest(b""))
    assert (r.status, r.body) == (200, f"1:{tmp_path}".encode())
    # package.module:Class form (the file's directory is on sys.path now).
    p2 = create_processor(echo_service(entry="procmod_h3:P"))
    p2.load()
    assert p2.handle(WorkerRequest(b"")).body.startswith(b"0:")
    for entry, err in ((f"{mod}:Nope", "no class"), (f"{tmp_path}/missing.py:P", "not found")):
        with pytest.raises(Exception, match=err):
            create_processor(echo_service(entry=entry)).load()
    with pytest.raises(LoadError, match=r"^initialize\(\) raised RuntimeError: initialize failed on purpose"):
        create_processor(echo_service(entry=ECHO_ENTRY, config={"fail_initialize": True})).load()
