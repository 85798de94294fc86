"""The numpy codec against protobuf's own serialisation (upb via eas_sdk._proto), and its server side.

Property tests: random shapes/dtypes/values encode to exactly the bytes protobuf writes and
decode back to the same arrays; varints match protobuf for every int32/int64; unpacked and
split packed encodings (which protobuf parsers must accept) decode too; arbitrary bytes
never raise anything but CodecError.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from eas_sdk._proto import blade_pb2, tf_predict_pb2, torch_predict_pb2
from eas_sdk.codecs import eas as t

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NUMERIC = [np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.bool_]
FIELD_NAME = {
    t.KIND_FLOAT: "float_val",
    t.KIND_DOUBLE: "double_val",
    t.KIND_INT32: "int_val",
    t.KIND_INT64: "int64_val",
    t.KIND_BOOL: "bool_val",
    t.KIND_BYTES: "string_val",
}


def _snappy(body: bytes) -> bytes:
    import cramjam

    return bytes(cramjam.snappy.compress_raw(body))


shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)


@st.composite
def arrays(draw: st.DrawFn, dtypes: list[Any] = NUMERIC) -> np.ndarray:
    dtype = draw(st.sampled_from(dtypes))
    return draw(hnp.arrays(dtype, draw(shapes)))


@st.composite
def string_arrays(draw: st.DrawFn) -> np.ndarray:
    shape = draw(shapes)
    items = draw(st.lists(st.binary(max_size=20), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr.reshape(shape)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        return a.tobytes() == b.tobytes()  # bit-exact, NaN payloads included
    return bool(np.array_equal(a, b))


def _fill(msg: Any, arr: np.ndarray, dt: int, family: str) -> None:
    msg.dtype = dt
    msg.array_shape.dim.extend(arr.shape)
    kind = t.value_kind(dt, family)
    values = arr.ravel()
    if kind == t.KIND_BYTES:
        getattr(msg, FIELD_NAME[kind]).extend(values.tolist())
    elif kind == t.KIND_FLOAT:
        getattr(msg, FIELD_NAME[kind]).extend(values.astype(np.float32).tolist())
    elif kind in (t.KIND_INT32, t.KIND_INT64):
        getattr(msg, FIELD_NAME[kind]).extend(values.astype(np.int64).tolist())
    else:
        getattr(msg, FIELD_NAME[kind]).extend(values.tolist())


@SETTINGS
@given(st.one_of(arrays(), string_arrays()), st.text(max_size=8), st.text(max_size=8))
def test_tf_request_bytes_equal_protobuf(arr: np.ndarray, name: str, sig: str) -> None:
    dt = t.dt_for_numpy(arr.dtype, "tf")
    ours = t.encode_tf_request(sig, {name: arr}, ["out"])
    msg = tf_predict_pb2.PredictRequest(signature_name=sig, output_filter=["out"])
    _fill(msg.inputs[name], arr, dt, "tf")
    assert ours == msg.SerializeToString(deterministic=True)
    decoded = t.decode_tf_request(ours)
    assert decoded.signature_name == sig and decoded.output_filter == ["out"]
    tensor = decoded.inputs[name]
    assert tensor.dtype == dt
    if dt == t.DT_STRING:
        assert tensor.array.shape == arr.shape and tensor.array.ravel().tolist() == arr.ravel().tolist()
    else:
        assert _same(tensor.array, arr)


@SETTINGS
@given(st.one_of(arrays(), string_arrays()), st.text(max_size=8))
def test_tf_response_roundtrip_via_protobuf(arr: np.ndarray, name: str) -> None:
    body = t.encode_tf_response({name: arr})
    msg = tf_predict_pb2.PredictResponse.FromString(body)
    assert msg.SerializeToString(deterministic=True) == body
    out = msg.outputs[name]
    raw = t.decode_tf_response(body)[name]
    assert raw.dtype == out.dtype and raw.shape() == list(out.array_shape.dim)
    got = raw.to_tensor().array
    if arr.dtype.kind in "SO":
        assert got.ravel().tolist() == arr.ravel().tolist()
    else:
        # uint8/uint16 are answered as DT_INT32 so that eas-prediction can read them
        assert np.array_equal(got, arr, equal_nan=arr.dtype.kind == "f") and got.shape == arr.shape


@SETTINGS
@given(
    st.lists(st.one_of(st.none(), arrays()), max_size=3),
    st.dictionaries(st.text(max_size=5), arrays(), max_size=1),
)
def test_torch_request_bytes_equal_protobuf(
    inputs: list[np.ndarray | None], maps: dict[str, np.ndarray]
) -> None:
    ours = t.encode_torch_request(inputs, maps, output_filter=[0, -1], debug_level=3)
    msg = torch_predict_pb2.PredictRequest(output_filter=[0, -1], debug_level=3)
    for arr in inputs:
        entry = msg.inputs.add()
        if arr is not None:
            _fill(entry, arr, t.dt_for_numpy(arr.dtype, "torch"), "torch")
    for key, arr in maps.items():
        _fill(msg.map_inputs[key], arr, t.dt_for_numpy(arr.dtype, "torch"), "torch")
    assert ours == msg.SerializeToString(deterministic=True)
    decoded = t.decode_torch_request(ours)
    assert decoded.output_filter == [0, -1] and decoded.debug_level == 3
    for got, arr in zip(decoded.inputs, inputs, strict=True):
        if arr is None:
            assert got is None
        else:
            expect = arr.astype(np.int32) if arr.dtype == np.bool_ else arr  # no bool_val in torch
            assert got is not None and np.array_equal(got.array.astype(expect.dtype), expect, equal_nan=True)
    for sniffed in (
        t.decode_torch_request(_snappy(ours), compressed=None),
        t.decode_torch_request(ours, None),
    ):
        assert sniffed.output_filter == decoded.output_filter and len(sniffed.inputs) == len(decoded.inputs)
        assert sniffed.map_inputs.keys() == decoded.map_inputs.keys()


@SETTINGS
@given(
    st.lists(st.tuples(st.text(min_size=1, max_size=5), arrays([np.float32, np.int32, np.int64])), max_size=3)
)
def test_blade_roundtrip_via_protobuf(items: list[tuple[str, np.ndarray]]) -> None:
    inputs = [t.BladeInput(name, arr) for name, arr in items]
    req = t.encode_blade_request("sig", inputs, [("o", 1)])
    msg = blade_pb2.Request.FromString(req)
    assert msg.SerializeToString() == req
    decoded = t.decode_blade_request(req)
    assert decoded.signature_name == "sig" and decoded.output_info == [("o", 1)]
    for got, (name, arr) in zip(decoded.inputs, items, strict=True):
        # Blade carries no dtype: an empty tensor cannot tell which field it came from.
        assert got.name == name and (
            _same(got.array, arr) or (arr.size == 0 and got.array.shape == arr.shape)
        )
        assert got.batchsize == (arr.shape[0] if arr.ndim and arr.shape[0] > 0 else 1)
    body = t.encode_blade_response(inputs)
    pb = blade_pb2.Response.FromString(body)  # proto2: parses only if batchsize is present
    assert pb.SerializeToString() == body
    for raw, (name, arr) in zip(t.decode_blade_response(body), items, strict=True):
        got = raw.to_tensor().array
        assert raw.name_in_dl_model == name and (
            _same(got, arr) or (arr.size == 0 and got.shape == arr.shape)
        )


@SETTINGS
@given(
    st.one_of(arrays([*NUMERIC, np.uint32, np.float16]), string_arrays()),
    st.text(max_size=5),
    st.booleans(),
)
def test_response_fast_paths_equal_the_checked_path(arr: np.ndarray, name: str, torch: bool) -> None:
    """Answers written straight from numpy memory are the bytes of the validated path, which
    a Tensor (or a Blade output with its dtype given) takes."""
    family = "torch" if torch else "tf"
    dt = t.dt_for_numpy(arr.dtype, family, response=True)
    fast = t.encode_tf_response({name: arr}) if not torch else t.encode_torch_response([arr])
    checked = (
        t.encode_tf_response({name: t.Tensor(arr, dt)})
        if not torch
        else t.encode_torch_response([t.Tensor(arr, dt)])
    )
    assert fast == checked
    blade_dt = t.dt_for_numpy(arr.dtype, "blade")
    assert t.encode_blade_response([t.BladeInput(name, arr)]) == t.encode_blade_response(
        [t.BladeInput(name, arr, dtype=blade_dt)]
    )


@SETTINGS
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50))
def test_int64_varints_equal_protobuf(values: list[int]) -> None:
    arr = np.array(values, dtype=np.int64)
    ours = t.encode_varints(arr)
    msg = tf_predict_pb2.ArrayProto(int64_val=values)
    body = msg.SerializeToString()
    if values:
        assert body.endswith(ours)
    assert np.array_equal(t.decode_varints(ours).view(np.int64), arr)


@SETTINGS
@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=50))
def test_int32_varints_equal_protobuf(values: list[int]) -> None:
    payload = t.wire_payload(t.to_wire_values(values, t.KIND_INT32), t.KIND_INT32)
    body = tf_predict_pb2.ArrayProto(int_val=values).SerializeToString()
    assert body == (b"\x2a" + t.varint(len(payload)) + payload if values else b"")


def test_varint_chunking_and_large_arrays() -> None:
    rng = np.random.default_rng(1)
    arr = rng.integers(-(2**63), 2**63 - 1, size=(1 << 20) + 17, dtype=np.int64)
    enc = t.encode_varints(arr)
    assert np.array_equal(t.decode_varints(enc).view(np.int64), arr)


def _entry(key: bytes, inner: bytes) -> bytes:
    entry = b"\x0a" + t.varint(len(key)) + key + b"\x12" + t.varint(len(inner)) + inner
    return b"\x0a" + t.varint(len(entry)) + entry


def test_unpacked_and_split_fields_decode() -> None:
    # float_val unpacked (tag 0x1d) twice, then a packed chunk: all must concatenate in order.
    inner = (
        b"\x08\x01\x12\x03\x0a\x01\x03"
        + b"\x1d"
        + np.float32(1).tobytes()
        + b"\x1d"
        + np.float32(2).tobytes()
    )
    inner += b"\x1a\x04" + np.float32(3).tobytes()
    body = _entry(b"y", inner)
    pb = tf_predict_pb2.PredictResponse.FromString(body)
    assert list(pb.outputs["y"].float_val) == [1.0, 2.0, 3.0]
    assert t.decode_tf_response(body)["y"].to_tensor().array.tolist() == [1.0, 2.0, 3.0]
    # int_val unpacked varints plus a packed chunk
    inner = b"\x08\x03\x28\x05\x28" + t.varint(-1) + b"\x2a\x01\x07"
    body = _entry(b"z", inner)
    assert list(tf_predict_pb2.PredictResponse.FromString(body).outputs["z"].int_val) == [5, -1, 7]
    assert t.decode_tf_response(body)["z"].to_tensor().array.tolist() == [5, -1, 7]


def test_unknown_fields_are_skipped() -> None:
    body = t.encode_tf_response({"y": np.array([1.5], np.float32)})
    extra = b"\x78\x05" + b"\x82\x01\x02ab" + b"\x8d\x01abcd" + b"\x89\x01abcdefgh"
    assert t.decode_tf_response(extra + body + extra)["y"].to_tensor().array.tolist() == [1.5]


@pytest.mark.parametrize(
    "body",
    [
        b"\x0a",
        b"\x0a\x05\x0a\x01",
        b"\x0a\x07\x0a\x01y\x12\x02\x1a\x03",  # packed float length 3
        b"\x0a\x0a\x0a\x01y\x12\x05\x08\x01\x1a\x01\xff",  # packed float length 1
        b"\x0b",  # group start wire type
        b"\x0a\x06\x0a\x01y\x12\x01\x08",  # truncated varint
        b"\x0a" + b"\xff" * 11,
    ],
)
def test_malformed_bodies_raise_codec_error(body: bytes) -> None:
    with pytest.raises(t.CodecError):
        t.decode_tf_response(body)  # outputs map is field 1
    with pytest.raises(t.CodecError):
        t.decode_tf_request(b"\x12" + body[1:] if body[:1] == b"\x0a" else body)  # inputs map is field 2


def test_server_decode_validates_tensors() -> None:
    msg = tf_predict_pb2.PredictRequest()
    msg.inputs["x"].dtype = t.DT_FLOAT
    msg.inputs["x"].array_shape.dim.extend([2, 2])
    msg.inputs["x"].float_val.extend([1.0, 2.0, 3.0])
    with pytest.raises(t.CodecError, match=r"shape \[2, 2\] needs 4 values, got 3"):
        t.decode_tf_request(msg.SerializeToString())
    msg.inputs["x"].dtype = t.DT_HALF
    with pytest.raises(t.CodecError, match="unsupported dtype DT_HALF"):
        t.decode_tf_request(msg.SerializeToString())
    msg.inputs["x"].dtype = t.DT_INT8
    del msg.inputs["x"].float_val[:]
    msg.inputs["x"].int_val.extend([1, 2, 3, 300])
    with pytest.raises(t.CodecError, match="out of range"):
        t.decode_tf_request(msg.SerializeToString())
    del msg.inputs["x"].int_val[:]
    msg.inputs["x"].int64_val.extend([1, 2, 3, 4])
    with pytest.raises(t.CodecError, match="expected in the int32 field"):
        t.decode_tf_request(msg.SerializeToString())
    # no shape at all: a flat vector
    msg = tf_predict_pb2.PredictRequest()
    msg.inputs["v"].dtype = t.DT_DOUBLE
    msg.inputs["v"].double_val.extend([1.0, 2.0])
    assert t.decode_tf_request(msg.SerializeToString()).inputs["v"].array.shape == (2,)


@pytest.mark.parametrize("dims", [[200, 1], [0, 130, 20000], [127, 2], [1, 1 << 20, 0]])
def test_server_decode_reads_dims_of_any_varint_length(dims: list[int]) -> None:
    msg = tf_predict_pb2.PredictRequest()
    msg.inputs["x"].dtype = t.DT_FLOAT
    msg.inputs["x"].array_shape.dim.extend(dims)
    msg.inputs["x"].float_val.extend([0.5] * int(np.prod(dims)))
    assert t.decode_tf_request(msg.SerializeToString()).inputs["x"].array.shape == tuple(dims)


def test_server_decode_refuses_a_negative_dim() -> None:
    msg = tf_predict_pb2.PredictRequest()
    msg.inputs["x"].dtype = t.DT_FLOAT
    msg.inputs["x"].array_shape.dim.extend([2, -1])
    msg.inputs["x"].float_val.extend([1.0, 2.0])
    with pytest.raises(t.CodecError, match=r"negative dimension in shape \[2, -1\]"):
        t.decode_tf_request(msg.SerializeToString())


def test_server_decode_is_zero_copy_for_floats() -> None:
    x = np.arange(1000, dtype=np.float32).reshape(10, 100)
    body = t.encode_tf_request("s", {"x": x})
    got = t.decode_tf_request(body).inputs["x"].array
    assert np.shares_memory(got, np.frombuffer(body, np.uint8))
    assert np.array_equal(got, x)
    assert t.decode_tf_request(memoryview(body)).inputs["x"].array.tolist() == x.tolist()
    assert t.decode_tf_request(bytearray(body)).inputs["x"].array.tolist() == x.tolist()


def test_torch_server_side_snappy_modes() -> None:
    body = t.encode_torch_request([np.ones(64, np.float32)])
    packed = _snappy(body)
    assert t.decode_torch_request(packed, compressed=True).inputs[0] is not None
    assert t.decode_torch_request(packed, compressed=None).inputs[0].array.shape == (64,)  # type: ignore[union-attr]
    with pytest.raises(t.CodecError):
        t.decode_torch_request(b"\xff\xff\xff\xff\x0f" + b"\x00" * 4, compressed=True)


def test_response_dtype_choices_for_the_original_client() -> None:
    assert t.dt_for_numpy(np.uint8, "tf", response=True) == t.DT_INT32
    assert t.dt_for_numpy(np.uint16, "tf", response=True) == t.DT_INT32
    # Torch answers uint8 and bool as DT_INT32 (int_val), as the gateway always has.
    assert t.dt_for_numpy(np.uint8, "torch", response=True) == t.DT_INT32
    assert t.dt_for_numpy(np.bool_, "torch", response=True) == t.DT_INT32
    assert t.dt_for_numpy(np.uint8, "torch") == t.DT_UINT8  # a request keeps its dtype
    assert t.dt_for_numpy(np.float16, "tf") == t.DT_FLOAT
    assert t.dt_for_numpy(np.uint32, "tf") == t.DT_INT64
    body = t.encode_tf_response({"s": np.array(["h\u00e9"])})  # a server may answer str arrays
    assert t.decode_tf_response(body)["s"].values(t.KIND_BYTES) == ["h\u00e9".encode()]
    with pytest.raises(ValueError, match="int64 range"):
        t.encode_tf_response({"u": np.array([2**64 - 1], np.uint64)})


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_only_raise_codec_error(body: bytes) -> None:
    for fn in (t.decode_tf_request, t.decode_blade_request, t.decode_tf_response, t.decode_blade_response):
        try:
            fn(body)
        except t.CodecError:
            pass
    for compressed in (False, None):
        try:
            t.decode_torch_request(body, compressed=compressed)
        except t.CodecError:
            pass
    try:
        for raw in t.decode_torch_response(body)[0]:
            raw.to_tensor()
    except t.CodecError:
        pass


@pytest.mark.parametrize(
    "values",
    [
        np.array([-1, -(2**31), -5], dtype=np.int32),  # every varint 10 bytes (dense path)
        np.array([128, 200, 16383], dtype=np.int64),  # every varint 2 bytes (dense path)
        np.array([0, 1, 127, 128, 2**35, -1, 2**63 - 1, -(2**63)], dtype=np.int64),  # mixed widths
        np.arange(-3000, 3000, dtype=np.int64),
        np.arange(256, dtype=np.uint8),  # uint8 from 128 up takes two bytes
        np.array([0, 200, 255, 7], dtype=np.uint8),  # the few-values path
    ],
)
def test_varint_paths_match_protobuf(values: np.ndarray) -> None:
    ours = t.encode_varints(values)
    body = tf_predict_pb2.ArrayProto(int64_val=values.astype(np.int64).tolist()).SerializeToString()
    assert body == b"\x3a" + t.varint(len(ours)) + ours
    assert np.array_equal(t.decode_varints(ours).view(np.int64), values.astype(np.int64))


def test_varint_decode_rejects_truncated_and_overlong() -> None:
    with pytest.raises(t.CodecError, match="truncated"):
        t.decode_varints(b"\x01\x80")
    with pytest.raises(t.CodecError, match="longer than 10"):
        t.decode_varints(b"\x01" + b"\xff" * 10 + b"\x01")
