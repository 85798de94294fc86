"""V2 gRPC inference messages <-> arrays (raw and typed contents)."""

from __future__ import annotations

import numpy as np
import pytest

from gateway._proto import grpc_service_pb2 as pb
from gateway.codecs import v2_grpc
from gateway.codecs.v2_tensors import DATATYPES, TensorError, to_raw


def raw_request(**arrays: np.ndarray) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", id="r")
    for name, arr in arrays.items():
        kind = "BYTES" if arr.dtype.kind == "O" else {v: k for k, v in DATATYPES.items()}[arr.dtype]
        req.inputs.add(name=name, datatype=kind, shape=arr.shape)
        req.raw_input_contents.append(bytes(to_raw(arr)))
    return req


def test_raw_inputs_are_read_with_their_datatypes_and_shapes() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.array([[1, -2]], dtype=np.int64)
    s = np.array([b"a", b"\xff\x00", b""], dtype=object)
    req = raw_request(x=x, y=y, s=s)
    req.outputs.add(name="out2")
    req.outputs.add(name="out1")
    call = v2_grpc.parse_infer(req)
    assert list(call.inputs) == ["x", "y", "s"] and call.outputs == ("out2", "out1") and not call.typed
    np.testing.assert_array_equal(call.inputs["x"], x)
    assert call.inputs["y"].dtype == np.int64 and call.inputs["y"].tolist() == [[1, -2]]
    assert call.inputs["s"].tolist() == [b"a", b"\xff\x00", b""]
    assert call.parameters == {}


def test_the_request_parameters_become_plain_values() -> None:
    req = raw_request(x=np.zeros(1, dtype=np.float32))
    req.parameters["top"].int64_param = 3
    req.parameters["mode"].string_param = "fast"
    req.parameters["exact"].bool_param = True
    req.parameters["cut"].double_param = 0.5
    req.parameters["big"].uint64_param = 2**63
    req.parameters["unset"].Clear()
    call = v2_grpc.parse_infer(req)
    want = {"top": 3, "mode": "fast", "exact": True, "cut": 0.5, "big": 2**63, "unset": None}
    assert call.parameters == want


@pytest.mark.parametrize(
    ("datatype", "field", "values", "dtype"),
    [
        ("BOOL", "bool_contents", [True, False], np.bool_),
        ("INT8", "int_contents", [-128, 127], np.int8),
        ("INT32", "int_contents", [-(2**31), 7], np.int32),
        ("INT64", "int64_contents", [2**40, -1], np.int64),
        ("UINT8", "uint_contents", [0, 255], np.uint8),
        ("UINT16", "uint_contents", [0, 65535], np.uint16),
        ("UINT64", "uint64_contents", [2**63, 1], np.uint64),
        ("FP32", "fp32_contents", [0.5, -1.25], np.float32),
        ("FP64", "fp64_contents", [0.1, 2.0], np.float64),
        ("BYTES", "bytes_contents", [b"x", b""], object),
    ],
)
def test_typed_contents_round_trip(datatype: str, field: str, values: list, dtype: type) -> None:
    req = pb.ModelInferRequest(model_name="m")
    t = req.inputs.add(name="x", datatype=datatype, shape=[1, 2])
    getattr(t.contents, field).extend(values)
    call = v2_grpc.parse_infer(req)
    arr = call.inputs["x"]
    assert call.typed and arr.shape == (1, 2) and arr.dtype == np.dtype(dtype)
    assert arr.ravel().tolist() == values
    resp = v2_grpc.infer_response("m", "id-1", {"y": arr}, ["y"], typed=True)
    assert not resp.raw_output_contents
    (out,) = resp.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("y", datatype, [1, 2])
    assert list(getattr(out.contents, field)) == values


def test_raw_answer_in_the_requested_order_and_fp16_always_raw() -> None:
    a = np.arange(4, dtype=np.float16)
    b = np.array([[1, 2]], dtype=np.int64)
    resp = v2_grpc.infer_response("m", "r", {"a": a, "b": b}, ["b", "a", "missing"], typed=True)
    assert resp.model_name == "m" and resp.model_version == "1" and resp.id == "r"
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [
        ("b", "INT64", [1, 2]),
        ("a", "FP16", [4]),
    ]
    assert [len(r) for r in resp.raw_output_contents] == [16, 8]
    assert np.frombuffer(resp.raw_output_contents[0], "<i8").tolist() == [1, 2]
    assert not resp.outputs[0].HasField("contents")


def _one_input(**kw: object) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", **kw)
    return req


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: pb.ModelInferRequest(model_name="m"), "at least one input"),
        (lambda: _one_input(datatype="FP32", shape=[2]), "needs 2 values in fp32_contents, got 0"),
        (lambda: _one_input(datatype="FP16", shape=[1]), "send it in raw_input_contents"),
        (lambda: _one_input(datatype="COMPLEX", shape=[1]), "datatype 'COMPLEX' is not one of"),
        (lambda: _one_input(datatype="FP32", shape=[-1]), "non-negative"),
        (lambda: _one_input(datatype="INT8", shape=[1], contents=pb.InferTensorContents(int_contents=[300])),
         "does not fit INT8"),
    ],
)  # fmt: skip
def test_bad_typed_requests_name_the_problem(make: object, needle: str) -> None:
    with pytest.raises(TensorError, match=needle):
        v2_grpc.parse_infer(make())  # type: ignore[operator]


def test_bad_raw_requests_name_the_problem() -> None:
    req = raw_request(x=np.zeros(3, np.float32))
    req.inputs[0].shape[:] = [4]
    with pytest.raises(TensorError, match="input 'x': FP32 shape \\[4\\] needs 16 bytes, got 12"):
        v2_grpc.parse_infer(req)
    req = raw_request(x=np.zeros(3, np.float32), y=np.zeros(1, np.int64))
    del req.raw_input_contents[1]
    with pytest.raises(TensorError, match="raw_input_contents has 1 entries for 2 inputs"):
        v2_grpc.parse_infer(req)
    req = raw_request(x=np.zeros(3, np.float32))
    req.inputs[0].contents.fp32_contents.extend([1.0, 2.0, 3.0])
    with pytest.raises(TensorError, match="not both"):
        v2_grpc.parse_infer(req)
    req = raw_request(x=np.zeros(1, np.float32))
    req.inputs.add(name="x", datatype="FP32", shape=[1])
    req.raw_input_contents.append(b"\x00" * 4)
    with pytest.raises(TensorError, match="given twice"):
        v2_grpc.parse_infer(req)


def test_output_parameters() -> None:
    req = raw_request(x=np.zeros(1, np.float32))
    req.outputs.add(name="y").parameters["binary_data"].bool_param = True  # harmless: outputs are raw
    assert v2_grpc.parse_infer(req).outputs == ("y",)
    req.outputs[0].parameters["classification"].int64_param = 3
    with pytest.raises(TensorError, match="classification extension is not supported"):
        v2_grpc.parse_infer(req)
    req = raw_request(x=np.zeros(1, np.float32))
    req.outputs.add(name="y")
    req.outputs.add(name="y")
    with pytest.raises(TensorError, match="requested twice"):
        v2_grpc.parse_infer(req)


_EDGES = {
    "INT8": np.array([-128, -1, 0, 127], np.int8),
    "INT16": np.array([-32768, 300, 32767], np.int16),
    "INT32": np.array([-(2**31), -1, 0, 127, 128, 2**31 - 1], np.int32),
    "INT64": np.array([-(2**63), -1, 0, 2**35, 2**63 - 1], np.int64),
    "UINT8": np.array([0, 128, 255], np.uint8),
    "UINT16": np.array([0, 65535], np.uint16),
    "UINT32": np.array([0, 128, 2**32 - 1], np.uint32),
    "UINT64": np.array([0, 1 << 35, 2**64 - 1], np.uint64),
    "FP32": np.array([[0.1, -2.5], [np.inf, np.nan]], np.float32),
    "FP64": np.array([1e-300, -0.0, 3.5]),
    "BOOL": np.array([True, False, True]),
}


@pytest.mark.parametrize("datatype", sorted(_EDGES))
def test_typed_answers_are_what_protobuf_builds_element_by_element(datatype: str) -> None:
    """The packed bytes written from the array are the message protobuf's own per-element
    build makes, byte for byte, edge values and an empty tensor included."""
    for arr in (_EDGES[datatype], _EDGES[datatype][:0]):
        got = v2_grpc.infer_response("m", "r", {"y": arr}, ["y"], typed=True)
        want = pb.ModelInferResponse(model_name="m", model_version="1", id="r")
        out = want.outputs.add(name="y", datatype=datatype, shape=arr.shape)
        getattr(out.contents, v2_grpc.CONTENTS_FIELD[datatype]).extend(arr.reshape(-1).tolist())
        assert got.SerializeToString() == want.SerializeToString(), datatype
        assert v2_grpc.typed_size(arr, datatype) <= len(out.contents.SerializeToString())


@pytest.mark.parametrize("typed", [False, True])
def test_an_answer_past_the_limit_is_refused_before_it_is_built(typed: bool) -> None:
    arr = np.zeros((1000, 1000), np.float32)  # 4 MB in either form
    with pytest.raises(v2_grpc.json_answer.AnswerTooLarge) as info:
        v2_grpc.infer_response("m", "r", {"y": arr}, ["y"], typed=typed, limit=1 << 20)
    assert "4000000 bytes" in str(info.value) and "gateway.max_response_bytes" in str(info.value)
    assert v2_grpc.infer_response("m", "r", {"y": arr}, ["y"], typed=typed, limit=8 << 20).outputs
