"""Unit tests of the request/response types: API surface, numpy improvements, validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

import eas_sdk
from eas_sdk._proto import blade_pb2, tf_predict_pb2, torch_predict_pb2
from eas_sdk.codecs import eas as t
from eas_sdk.requests import (
    BladeRequest,
    BladeResponse,
    InvalidInputError,
    InvalidInputTypeError,
    Request,
    StringRequest,
    StringResponse,
    TFRequest,
    TFResponse,
    TorchRequest,
    TorchResponse,
    UnknownOutputError,
)

# ----------------------------------------------------------------------------- API surface


def test_top_level_exports_are_the_same_classes() -> None:
    assert eas_sdk.TFRequest is TFRequest
    assert eas_sdk.TorchResponse is TorchResponse
    assert eas_sdk.StringRequest is StringRequest
    assert eas_sdk.BladeResponse is BladeResponse


def test_dt_constants_match_the_wire_enums() -> None:
    for name, value in tf_predict_pb2.ArrayDataType.items():
        assert getattr(TFRequest, name) == value, name
        assert getattr(TorchRequest, name) == value, name
    assert TFRequest.TF_BOOL == TFRequest.DT_BOOL == 10
    for name, value in blade_pb2.DataType.items():
        assert getattr(BladeRequest, name) == value, name


def test_every_request_is_a_request_with_the_two_methods() -> None:
    for req in (StringRequest("x"), TFRequest("s"), TorchRequest(), BladeRequest("s")):
        assert isinstance(req, Request)
        assert isinstance(req.to_bytes(), bytes)
        assert req.content_type is None


# ----------------------------------------------------------------------------- TF


def test_tf_numpy_feed_takes_shape_and_dtype_from_array() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = TFRequest("s")
    a.add_feed("x", None, None, x)
    b = TFRequest("s")
    b.add_feed("x", [2, 3, 4], TFRequest.DT_FLOAT, x.ravel().tolist())
    assert a.to_string() == b.to_string()
    msg = a.request_data
    assert list(msg.inputs["x"].array_shape.dim) == [2, 3, 4]
    assert list(msg.inputs["x"].float_val) == x.ravel().tolist()


@pytest.mark.parametrize(
    ("dtype", "dt"),
    [
        (np.float32, TFRequest.DT_FLOAT),
        (np.float64, TFRequest.DT_DOUBLE),
        (np.int8, TFRequest.DT_INT8),
        (np.int16, TFRequest.DT_INT16),
        (np.int32, TFRequest.DT_INT32),
        (np.int64, TFRequest.DT_INT64),
        (np.uint8, TFRequest.DT_UINT8),
        (np.uint16, TFRequest.DT_UINT16),
        (np.bool_, TFRequest.DT_BOOL),
    ],
)
def test_tf_dtype_inference(dtype: type, dt: int) -> None:
    x = (np.arange(6) % 2).astype(dtype).reshape(2, 3)
    req = TFRequest("s")
    req.add_feed("x", None, None, x)
    msg = req.request_data.inputs["x"]
    assert msg.dtype == dt
    field = {1: "float_val", 2: "double_val", 9: "int64_val", 10: "bool_val"}.get(dt, "int_val")
    assert np.array_equal(np.array(getattr(msg, field)), x.ravel())


def test_tf_non_contiguous_and_big_endian_arrays() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for view in (x.T, x[:, ::2], x.astype(">f4")):
        req = TFRequest("s")
        req.add_feed("x", None, TFRequest.DT_FLOAT, view)
        msg = req.request_data.inputs["x"]
        assert list(msg.array_shape.dim) == list(view.shape)
        assert list(msg.float_val) == np.ascontiguousarray(view).ravel().tolist()


def test_tf_strings_from_object_and_bytes_arrays() -> None:
    req = TFRequest("s")
    req.add_feed("a", None, TFRequest.DT_STRING, np.array([b"x", b"yz"], dtype=object))
    req.add_feed("b", [2], TFRequest.DT_STRING, [b"p", bytearray(b"q")])
    msg = req.request_data
    assert list(msg.inputs["a"].string_val) == [b"x", b"yz"]
    assert list(msg.inputs["b"].string_val) == [b"p", b"q"]


def test_tf_request_without_signature_sends_none() -> None:
    req = TFRequest()
    req.add_feed("x", [1], TFRequest.DT_FLOAT, [1.0])
    assert req.request_data.signature_name == ""
    assert not req.to_string().startswith(b"\x0a")


def test_to_string_is_cached_and_invalidated() -> None:
    req = TFRequest("s")
    req.add_feed("x", [2], TFRequest.DT_FLOAT, np.array([1, 2], np.float32))
    first = req.to_string()
    assert req.to_string() is first
    req.add_fetch("y")
    second = req.to_string()
    assert second != first and second.startswith(first)


def test_request_snapshots_the_array_at_add_feed() -> None:
    x = np.zeros(4, dtype=np.float32)
    req = TFRequest("s")
    req.add_feed("x", None, None, x)
    before = req.to_string()
    x[:] = 7
    req.add_fetch("o")  # forces a rebuild
    assert req.request_data.inputs["x"].float_val == [0.0] * 4
    assert req.to_string().startswith(before)


@pytest.mark.parametrize(
    ("args", "exc", "fragment"),
    [
        (("x", [3], TFRequest.DT_FLOAT, [1.0, 2.0]), InvalidInputError, "needs 3 values, got 2"),
        (("x", [2], 99, [1, 2]), InvalidInputError, "unsupported dtype 99"),
        (("x", [2], TFRequest.DT_HALF, [1, 2]), InvalidInputError, "DT_HALF"),
        (("x", [1], TFRequest.DT_FLOAT, ["1"]), InvalidInputTypeError, "numeric"),
        (("x", [1], TFRequest.DT_FLOAT, "1"), InvalidInputTypeError, "numeric"),
        (("x", [1], TFRequest.DT_FLOAT, [object()]), InvalidInputTypeError, "non-numeric"),
        (("x", [1], TFRequest.DT_INT32, [1.5]), InvalidInputTypeError, "integers"),
        (("x", [1], TFRequest.DT_INT32, [2**31]), InvalidInputError, "int32 range"),
        (("x", [1], TFRequest.DT_INT64, [2**63]), InvalidInputError, "int64 range"),
        (("x", [1], TFRequest.DT_INT64, [2**70]), InvalidInputError, "64-bit range"),
        (("x", [1], TFRequest.DT_BOOL, [0.5]), InvalidInputTypeError, "integers"),
        (("x", [1], TFRequest.DT_STRING, ["abc"]), InvalidInputTypeError, "needs bytes, got str"),
        (("x", [1], TFRequest.DT_STRING, np.array(["abc"])), InvalidInputTypeError, "str array"),
        (("x", [1], TFRequest.DT_STRING, [1]), InvalidInputTypeError, "needs bytes"),
        (("x", [-1, 2], TFRequest.DT_FLOAT, [1.0, 2.0]), InvalidInputError, "negative dimension"),
        (("x", [1.5], TFRequest.DT_FLOAT, [1.0]), InvalidInputTypeError, "dims must be ints"),
        (("x", [2**62, 2**62], TFRequest.DT_FLOAT, [1.0]), InvalidInputError, "more than int64"),
        (("x", [2**64], TFRequest.DT_FLOAT, [1.0]), InvalidInputError, "exceeds int64"),
        (("x", None, None, [1 + 2j]), InvalidInputTypeError, "no EAS dtype"),
    ],
)
def test_tf_validation_names_the_input(args: tuple, exc: type[Exception], fragment: str) -> None:
    req = TFRequest("s")
    with pytest.raises(exc) as info:
        req.add_feed(*args)
    assert fragment in str(info.value)
    assert "'x'" in str(info.value) or "input" in str(info.value)
    assert req.to_string() == b""  # a failed feed leaves the request untouched


def test_tf_float_conversions_follow_protobuf() -> None:
    req = TFRequest("s")
    big = float(np.finfo(np.float32).max) * (1 + 2**-25)  # numpy alone would round this down
    req.add_feed("x", [4], TFRequest.DT_FLOAT, [big, -big, True, 3])
    vals = list(req.request_data.inputs["x"].float_val)
    assert vals[:2] == [math.inf, -math.inf] and vals[2:] == [1.0, 3.0]


def test_tf_response_api_and_zero_copy_numpy() -> None:
    out = np.arange(12, dtype=np.float32).reshape(3, 4)
    body = t.encode_tf_response({"y": out, "ids": np.array([5, 6], np.int64), "s": np.array([b"a"], object)})
    resp = TFRequest("s").parse_response(body)
    assert isinstance(resp, TFResponse)
    assert resp.get_tensor_shape("y") == [3, 4]
    assert resp.get_values("y") == out.ravel().tolist()
    arr = resp.to_numpy("y")
    assert np.array_equal(arr, out) and not arr.flags.writeable
    assert np.shares_memory(arr, np.frombuffer(body, np.uint8))
    assert resp.get_values("ids") == [5, 6] and resp.to_numpy("ids").dtype == np.int64
    assert resp.get_values("s") == [b"a"]
    assert resp.get_values("missing") is None and resp.get_tensor_shape("missing") == []
    with pytest.raises(KeyError, match="missing"):
        resp.to_numpy("missing")
    assert 'key: "y"' in str(resp)
    assert resp.response.outputs["y"].dtype == TFRequest.DT_FLOAT
    assert sorted(resp.output_names()) == ["ids", "s", "y"]


def test_tf_response_uint_outputs_readable() -> None:
    msg = tf_predict_pb2.PredictResponse()
    msg.outputs["u"].dtype = TFRequest.DT_UINT8
    msg.outputs["u"].array_shape.dim.extend([3])
    msg.outputs["u"].int_val.extend([0, 200, 255])
    resp = TFResponse(msg.SerializeToString())
    assert resp.get_values("u") == [0, 200, 255]  # the original returned None
    assert resp.to_numpy("u").dtype == np.uint8


def test_tf_response_malformed_raises_value_error() -> None:
    with pytest.raises(ValueError):
        TFResponse(b"\x0a\x10\x0a")
    msg = tf_predict_pb2.PredictResponse()
    msg.outputs["y"].dtype = TFRequest.DT_FLOAT
    msg.outputs["y"].array_shape.dim.extend([3])
    msg.outputs["y"].float_val.extend([1.0])
    resp = TFResponse(msg.SerializeToString())
    assert resp.get_values("y") == [1.0]  # flat access still works like the original
    with pytest.raises(ValueError, match=r"needs 3 values, got 1"):
        resp.to_numpy("y")


# ----------------------------------------------------------------------------- Torch


def test_torch_positional_map_fetch_debug_roundtrip_through_protobuf() -> None:
    req = TorchRequest()
    req.add_feed(1, None, None, np.ones((2, 2), np.float64))
    req.add_feed_map("mask", [3], TorchRequest.DT_INT64, [1, 0, -1])
    req.add_fetch(0)
    req.set_debug_level(2)
    msg = torch_predict_pb2.PredictRequest.FromString(req.to_string())
    assert len(msg.inputs) == 2 and msg.inputs[0].dtype == 0
    assert list(msg.inputs[1].double_val) == [1.0] * 4
    assert list(msg.map_inputs["mask"].int64_val) == [1, 0, -1]
    assert list(msg.output_filter) == [0] and msg.debug_level == 2


def test_torch_snappy_flag_and_toggle() -> None:
    import cramjam

    req = TorchRequest(flag=True)
    req.add_feed(0, None, None, np.zeros(1000, np.float32))
    packed = req.to_string()
    plain = bytes(cramjam.snappy.decompress_raw(packed))
    assert len(packed) < len(plain)
    assert torch_predict_pb2.PredictRequest.FromString(plain).inputs[0].array_shape.dim == [1000]
    req.flag = False
    assert req.to_string() == plain


def test_torch_bool_and_string_travel_instead_of_being_dropped() -> None:
    req = TorchRequest()
    req.add_feed(0, None, None, np.array([True, False]))
    req.add_feed(1, [1], TorchRequest.DT_STRING, [b"hi"])
    msg = req.request_data
    assert msg.inputs[0].dtype == TorchRequest.DT_BOOL and list(msg.inputs[0].int_val) == [1, 0]
    assert list(msg.inputs[1].string_val) == [b"hi"]


@pytest.mark.parametrize(
    ("call", "exc"),
    [
        (lambda r: r.add_feed(-1, [1], 1, [1.0]), ValueError),
        (lambda r: r.add_feed("0", [1], 1, [1.0]), TypeError),
        (lambda r: r.add_feed(0, [2], 1, [1.0]), InvalidInputError),
        (lambda r: r.add_feed_map(3, [1], 1, [1.0]), TypeError),
        (lambda r: r.add_fetch(2**31), ValueError),
        (lambda r: r.set_debug_level(2**40), ValueError),
    ],
)
def test_torch_validation(call: object, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        call(TorchRequest())  # type: ignore[operator]


def test_torch_response_api() -> None:
    body = t.encode_torch_response(
        [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([True, False])],
        {"m": np.array([[1, 2]], np.int32)},
    )
    resp = TorchRequest().parse_response(body)
    assert resp.get_tensor_shape(0) == [2, 3]
    assert resp.get_values(0) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert resp.get_values(1) == [1, 0]  # bool answered as DT_INT32 so the original can read it
    assert resp.to_numpy(0).shape == (2, 3)
    assert resp.get_tensor_shape_map("m") == [1, 2] and resp.get_values_map("m") == [1, 2]
    assert resp.to_numpy("m").dtype == np.int32
    with pytest.raises(KeyError):
        resp.to_numpy("nope")
    assert "map_outputs" in str(resp)


# ----------------------------------------------------------------------------- Blade


def test_blade_request_matches_protobuf_and_numpy_path() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = BladeRequest("sig")
    a.add_feed("in", 2, None, None, x)
    a.add_feed("n", 1, [1], BladeRequest.DT_INT64, 5)  # the original's typo broke int64 scalars
    a.add_fetch("out", BladeRequest.DT_FLOAT)
    msg = blade_pb2.Request.FromString(a.to_string())
    assert msg.tf_signature_name == "sig"
    assert list(msg.inputs[0].shape.dim) == [2, 3] and list(msg.inputs[0].float_val) == x.ravel().tolist()
    assert msg.inputs[0].batchsize == 2 and msg.inputs[0].blade_blob_name == "in"
    assert list(msg.inputs[1].int64_val) == [5]
    assert msg.output_info[0].name_in_dl_model == "out" and msg.output_info[0].data_type == 1


def test_blade_without_signature_omits_it() -> None:
    req = BladeRequest()
    req.add_feed("a", 1, [1], BladeRequest.DT_FLOAT, 1.0)
    assert not blade_pb2.Request.FromString(req.to_string()).HasField("tf_signature_name")


@pytest.mark.parametrize(
    ("args", "exc"),
    [
        (("", 1, [1], 1, [1.0]), InvalidInputError),
        (("a", 0, [1], 1, [1.0]), InvalidInputError),
        (("a", True, [1], 1, [1.0]), InvalidInputError),
        (("a", 1, [2], 1, [1.0]), InvalidInputError),
        (("a", 1, [2], 1, 1.0), InvalidInputError),
        (("a", 1, [1], 7, [1.0]), InvalidInputError),
        (("a", 1, [1], 4, ["s"]), InvalidInputTypeError),
        (("a", 1, [1], 2, [1.5]), InvalidInputTypeError),
    ],
)
def test_blade_validation_is_also_assertion_error(args: tuple, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        BladeRequest("s").add_feed(*args)
    with pytest.raises(AssertionError):  # what the original raised
        BladeRequest("s").add_feed(*args)


def test_blade_fetch_validation() -> None:
    with pytest.raises(AssertionError):
        BladeRequest("s").add_fetch("", 1)
    with pytest.raises(InvalidInputError):
        BladeRequest("s").add_fetch("o", 9)


def test_blade_response_api() -> None:
    body = t.encode_blade_response({"out": np.ones((2, 3), np.float32), "ids": np.array([7], np.int64)})
    resp = BladeRequest("s").parse_response(body)
    assert resp.get_tensor_shape(" out") == [2, 3]
    assert resp.get_values("out", BladeRequest.DT_FLOAT) == [1.0] * 6
    assert resp.get_values("ids", BladeRequest.DT_INT64) == [7]
    assert resp.get_values("ids", BladeRequest.DT_UNKNOWN) == [7]
    assert resp.to_numpy("out").shape == (2, 3)
    with pytest.raises(UnknownOutputError):
        resp.get_tensor_shape("nope")
    with pytest.raises(AssertionError):
        resp.get_values("nope", 1)
    with pytest.raises(InvalidInputError):
        resp.get_values("out", 42)
    pb = resp.response
    assert pb.outputs[0].batchsize == 2 and pb.outputs[1].batchsize == 1


# ----------------------------------------------------------------------------- String


def test_string_request_and_response() -> None:
    req = StringRequest('[{"a": 1}]')
    assert req.to_string() == '[{"a": 1}]' and req.to_bytes() == b'[{"a": 1}]'
    assert StringRequest().to_string() == ""
    assert StringRequest(b"\x00").to_bytes() == b"\x00"
    resp = req.parse_response(b"ok \xc3\xa9")
    assert isinstance(resp, StringResponse)
    assert resp.response_data == b"ok \xc3\xa9"
    assert str(resp) == "b'ok \\xc3\\xa9'"  # like the original: bytes repr
    assert resp.text == "ok \u00e9"
    assert resp.to_numpy().tolist() == list(b"ok \xc3\xa9")


def test_known_response_vector() -> None:
    vector = bytes.fromhex("0a1c0a0673636f7265731212080112040a0201021a080000803e0000403f")
    assert t.encode_tf_response({"scores": np.array([[0.25, 0.75]], np.float32)}) == vector
    resp = TFResponse(vector)
    assert resp.get_tensor_shape("scores") == [1, 2] and resp.get_values("scores") == [0.25, 0.75]
    assert resp.to_numpy("scores").tolist() == [[0.25, 0.75]]


def test_blade_tf_request_takes_batch_from_shape() -> None:
    from eas_sdk.requests import BladeTFRequest, BladeTFResponse

    req = BladeTFRequest(signature_name="predict_words")
    req.add_feed("input_data", [2, 3], BladeTFRequest.DT_FLOAT, [0.8] * 6)
    req.add_feed("ids", None, None, np.array([[1], [2]], np.int32))
    req.add_fetch("output")
    msg = blade_pb2.Request.FromString(req.to_string())
    assert [i.batchsize for i in msg.inputs] == [2, 2]
    assert msg.output_info[0].data_type == BladeTFRequest.DT_UNKNOWN
    with pytest.raises(AssertionError):
        req.add_feed("scalar", [], BladeTFRequest.DT_FLOAT, 1.0)
    resp = req.parse_response(t.encode_blade_response({"output": np.array([[3, 4]], np.int64)}))
    assert isinstance(resp, BladeTFResponse) and resp.get_values("output") == [3, 4]
