# ruff: noqa: E501  (embedded reference-client snippets read best one call per line)
"""A server's side of the EAS codec: sniffing, decoding, validation and encoding of predict bodies.

Request bodies come from the real eas-prediction 0.36 client where it can build them;
responses we encode are read back by that client's own response classes.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eas_sdk._proto import blade_pb2, tf_predict_pb2, torch_predict_pb2
from eas_sdk.codecs import eas
from tests.eas_reference import run_reference

# Each snippet builds one request with the reference client; the script prints hex bodies.
_REF_BODIES = r"""
import json, sys
from eas_prediction import TFRequest, TorchRequest, BladeRequest, StringRequest
from eas_prediction.blade_tf_request import TFRequest as BladeTFRequest
out = {}
r = TFRequest('predict_images'); r.add_feed('images', [1, 2], TFRequest.DT_FLOAT, [1.0, 2.0]); r.add_fetch('scores')
out['tf'] = r.to_string().hex()
r = TFRequest('serving_default')
r.add_feed('x', [2, 4], TFRequest.DT_FLOAT, [float(i) for i in range(8)])
r.add_feed('y', [2, 4], TFRequest.DT_INT64, list(range(8)))
r.add_feed('z', [2, 4], TFRequest.DT_DOUBLE, [0.5] * 8)
r.add_feed('s', [2], TFRequest.DT_STRING, [b'a', b'bc'])
r.add_feed('b', [2], TFRequest.DT_BOOL, [True, False])
r.add_feed('u', [2], TFRequest.DT_UINT8, [1, 255])
out['tf_multi'] = r.to_string().hex()
r = TorchRequest(); r.add_feed(0, [1, 2], TorchRequest.DT_FLOAT, [1.0, 2.0]); r.add_fetch(0)
out['torch'] = r.to_string().hex()
r = TorchRequest(); r.add_feed(1, [1, 4], TorchRequest.DT_INT64, [1, 2, 3, 4])
out['torch_padded'] = r.to_string().hex()
r = TorchRequest(); r.add_feed(0, [1, 2], TorchRequest.DT_FLOAT, [1.0, 2.0]); r.set_debug_level(1)
out['torch_debug'] = r.to_string().hex()
r = TorchRequest(flag=True); r.add_feed(0, [2, 3], TorchRequest.DT_FLOAT, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
out['torch_snappy'] = r.to_string().hex()
r = TorchRequest(); r.add_feed_map('x', [1, 2], TorchRequest.DT_FLOAT, [1.0, 2.0])
out['torch_map'] = r.to_string().hex()
r = BladeRequest('sig'); r.add_feed('in', 1, [1, 2], BladeRequest.DT_FLOAT, [1.0, 2.0]); r.add_fetch('out', BladeRequest.DT_FLOAT)
out['blade'] = r.to_string().hex()
r = BladeRequest('sig'); r.add_feed('ids', 2, [2, 2], BladeRequest.DT_INT32, [1, 2, 3, 4])
out['blade_int'] = r.to_string().hex()
r = BladeTFRequest('serving_default'); r.add_feed('in', [3, 1], BladeRequest.DT_FLOAT, [1.0, 2.0, 3.0]); r.add_fetch('out')
out['blade_tf'] = r.to_string().hex()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def ref_bodies() -> dict[str, bytes]:
    proc = run_reference(_REF_BODIES)
    return {k: bytes.fromhex(v) for k, v in json.loads(proc.stdout).items()}


EXPECTED_KIND = {
    "tf": "tf",
    "tf_multi": "tf",
    "torch": "torch",
    "torch_padded": "torch",
    "torch_debug": "torch",
    "torch_snappy": "torch",
    "torch_map": "torch",
    "blade": "blade",
    "blade_int": "blade",
    "blade_tf": "blade",
}


@pytest.mark.compat
def test_sniffs_every_reference_body(ref_bodies: dict[str, bytes]) -> None:
    assert set(ref_bodies) == set(EXPECTED_KIND)
    for name, body in ref_bodies.items():
        req = eas.decode_request(body)
        assert req.kind == EXPECTED_KIND[name], name
    assert eas.decode_request(ref_bodies["torch_snappy"]).compressed
    assert not eas.decode_request(ref_bodies["torch"]).compressed


@pytest.mark.compat
def test_reference_bodies_decode_to_the_right_tensors(ref_bodies: dict[str, bytes]) -> None:
    tf = eas.decode_request(ref_bodies["tf_multi"])
    assert tf.signature == "serving_default"
    assert tf.named["x"].array.dtype == np.float32 and tf.named["x"].array.shape == (2, 4)
    assert tf.named["y"].array.dtype == np.int64 and tf.named["y"].array[1, 3] == 7
    assert tf.named["z"].array.dtype == np.float64
    assert list(tf.named["s"].array) == [b"a", b"bc"]
    assert tf.named["b"].array.tolist() == [True, False]
    assert tf.named["u"].array.dtype == np.uint8 and tf.named["u"].array.tolist() == [1, 255]

    padded = eas.decode_request(ref_bodies["torch_padded"])
    assert padded.positional[0] is None
    assert padded.positional[1] is not None and padded.positional[1].array.tolist() == [[1, 2, 3, 4]]

    snappy = eas.decode_request(ref_bodies["torch_snappy"])
    assert snappy.positional[0] is not None
    assert snappy.positional[0].array.tolist() == [[1, 2, 3], [4, 5, 6]]

    tmap = eas.decode_request(ref_bodies["torch_map"])
    assert tmap.by_map and tmap.named["x"].array.tolist() == [[1.0, 2.0]]

    blade = eas.decode_request(ref_bodies["blade"])
    assert blade.named["in"].loose and blade.output_names == ["out"]
    assert blade.output_types == {"out": blade_pb2.DT_FLOAT}
    assert eas.decode_request(ref_bodies["blade_int"]).named["ids"].array.dtype == np.int32
    assert eas.decode_request(ref_bodies["blade_tf"]).named["in"].array.shape == (3, 1)


@pytest.mark.compat
def test_explicit_format_and_header_override(ref_bodies: dict[str, bytes]) -> None:
    assert eas.decode_request(ref_bodies["tf"], "tf").kind == "tf"
    # The header wins over the service setting.
    assert eas.decode_request(ref_bodies["blade"], "tf", "blade").kind == "blade"
    # An explicitly configured torch service still accepts snappy bodies.
    assert eas.decode_request(ref_bodies["torch_snappy"], "torch").compressed
    with pytest.raises(eas.InvalidInput, match="unknown request format"):
        eas.decode_request(ref_bodies["tf"], "auto", "xml")
    with pytest.raises(eas.InvalidInput, match="cannot decode request as json"):
        eas.decode_request(ref_bodies["tf"], "json")


def test_known_wire_vectors() -> None:
    """Bodies the reference client writes for small calls (hex), sniffed and encoded."""
    tf = bytes.fromhex(
        "0a0e707265646963745f696d61676573121c0a06696d616765731212080112040a0201021a080000803f000000401a0673636f726573"
    )
    assert eas.sniff(tf) == "tf"
    torch = bytes.fromhex("0a12080112040a0201021a080000803f00000040120100")
    assert eas.sniff(torch) == "torch"
    snappy = bytes.fromhex("144c0a12080112040a0201021a080000803f00000040")
    assert eas.sniff(snappy) is None and eas.decode_request(snappy).compressed
    blade = bytes.fromhex(
        "0a03736967121a0a02696e1202696e180122040a0201022a080000803f000000401a0c0a036f757412036f75741801"
    )
    assert eas.sniff(blade) == "blade"
    # A float32 [[0.25, 0.75]] answer named "scores", byte for byte.
    out = eas.encode_tf_response([("scores", np.array([[0.25, 0.75]], np.float32))])
    assert out.hex() == "0a1c0a0673636f7265731212080112040a0201021a080000803e0000403f"


def test_malformed_bodies_are_400() -> None:
    for body in (b"\xff\xff\xff", b"\x0a\xff\x01", b"hello world", b"\x08"):
        with pytest.raises(eas.InvalidInput, match="cannot decode request"):
            eas.decode_request(body)
    for fmt in ("tf", "torch", "blade"):
        with pytest.raises(eas.InvalidInput, match=f"cannot decode request as {fmt}"):
            eas.decode_request(b"\x0a\xff\xff\xff\x0f", fmt)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200), st.sampled_from(["auto", "tf", "torch", "blade", "json"]))
def test_random_bytes_never_raise_anything_but_invalid_input(body: bytes, fmt: str) -> None:
    try:
        req = eas.decode_request(body, fmt)
    except eas.InvalidInput:
        return
    assert req.kind in eas.FORMATS


def _field(number: int, wire_type: int, payload: bytes | int) -> bytes:
    key = eas.varint(number << 3 | wire_type)
    if wire_type == 0:
        return key + eas.varint(int(payload))
    assert isinstance(payload, bytes)
    return key + (eas.varint(len(payload)) if wire_type == 2 else b"") + payload


# Protobuf-shaped bodies: fields numbered as the three families number theirs (and 100, Torch's
# debug_level), nested up to three deep, so that every branch of the sniffing is taken.
_leaf = st.sampled_from([b"", b"predict", b"\x08\x01", b"\x08\x01\x12\x02\x0a\x00", b"\xff\xfe", b"in"])
_messages = st.recursive(
    st.just(b""),
    lambda inner: st.lists(
        st.one_of(
            st.tuples(st.sampled_from([1, 2, 3, 4, 100]), st.just(0), st.integers(0, 300)),
            st.tuples(st.sampled_from([1, 2, 3, 4]), st.just(2), st.one_of(inner, _leaf)),
            st.tuples(st.sampled_from([1, 2, 3]), st.just(5), st.just(b"abcd")),
        ),
        max_size=4,
    ).map(lambda fs: b"".join(_field(*f) for f in fs)),
    max_leaves=12,
)


def _outcome(decode: Any) -> Any:
    try:
        req = decode()
    except eas.InvalidInput as exc:
        return ("invalid", exc.message)
    tensors = [*req.named.items(), *enumerate(req.positional)]
    arrays = [(k, None if t is None else (t.array.dtype.str, t.array.tolist())) for k, t in tensors]
    return (req.kind, req.signature, req.output_names, req.output_indices, arrays)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_messages)
def test_sniffing_decodes_as_the_sniffed_format_would(body: bytes) -> None:
    """Sniffing reuses its scan of the body for the decoding: the outcome is the one the
    sniffed format, named explicitly, gives."""
    kind = eas.sniff(body)
    if kind is None:
        return  # only a snappy-compressed Torch body is left, which is another test's
    assert _outcome(lambda: eas.decode_request(body)) == _outcome(lambda: eas.decode_request(body, kind))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(-3, 25),
    st.lists(st.integers(-(1 << 62), 1 << 62), max_size=4),
    st.lists(st.floats(width=32), max_size=6),
    st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=6),
    st.lists(st.binary(max_size=5), max_size=4),
    st.booleans(),
)
def test_any_tf_and_torch_message_decodes_or_is_invalid_input(
    dtype: int, dims: list[int], floats: list[float], ints: list[int], strings: list[bytes], torch: bool
) -> None:
    """Well-formed protobuf with any DT code, any dims and any values: a tensor whose size
    follows from the values sent, or InvalidInput; never another exception."""
    if torch:
        msg = torch_predict_pb2.PredictRequest()
        arr = msg.inputs.add()
    else:
        msg = tf_predict_pb2.PredictRequest(signature_name="s")
        arr = msg.inputs["x"]
    arr.dtype = dtype
    arr.array_shape.dim.extend(dims)
    arr.float_val.extend(floats)
    arr.int64_val.extend(ints)
    arr.string_val.extend(strings)
    try:
        req = eas.decode_request(msg.SerializeToString(), "torch" if torch else "tf")
    except eas.InvalidInput:
        return
    tensors = [t for t in [*req.named.values(), *req.positional] if t is not None]
    for t in tensors:
        assert t.array.size <= len(floats) + len(ints) + len(strings)


def test_shape_checks_happen_before_allocation() -> None:
    a = tf_predict_pb2.PredictRequest(signature_name="s")
    a.inputs["x"].dtype = tf_predict_pb2.DT_FLOAT
    a.inputs["x"].array_shape.dim.extend([2**31, 2**31])
    a.inputs["x"].float_val.extend([1.0, 2.0, 3.0])
    with pytest.raises(eas.InvalidInput, match="more than"):
        eas.decode_request(a.SerializeToString())
    a.inputs["x"].array_shape.ClearField("dim")
    a.inputs["x"].array_shape.dim.extend([2, 2])
    with pytest.raises(eas.InvalidInput, match=r"input 'x': shape \[2, 2\] needs 4 values, got 3"):
        eas.decode_request(a.SerializeToString())
    a.inputs["x"].array_shape.ClearField("dim")
    a.inputs["x"].array_shape.dim.extend([-1, 3])
    with pytest.raises(eas.InvalidInput, match="negative"):
        eas.decode_request(a.SerializeToString())
    u8 = tf_predict_pb2.PredictRequest(signature_name="s")
    u8.inputs["b"].dtype = tf_predict_pb2.DT_UINT8
    u8.inputs["b"].array_shape.dim.append(2)
    u8.inputs["b"].int_val.extend([1, 256])
    with pytest.raises(eas.InvalidInput, match="input 'b': value out of range"):
        eas.decode_request(u8.SerializeToString())
    with pytest.raises(eas.InvalidInput, match="needs 6 values, got 2"):
        eas.decode_request(b'{"inputs": {"x": {"shape": [2, 3], "dtype": "float32", "data": [1, 2]}}}')


def test_json_strings_are_never_padded_to_the_longest() -> None:
    # numpy's fixed-width unicode would take 200,001 x 400 kB = 80 GB for this 300 kB body.
    words = ["a"] * 200_000 + ["b" * 100_000]
    for doc in ({"x": words}, {"x": {"shape": [len(words)], "data": words}}):
        req = eas.decode_request(json.dumps({"inputs": doc}).encode())
        arr = req.named["x"].array
        assert arr.dtype == object and arr.shape == (len(words),) and arr[-1] == b"b" * 100_000
    for bad in (
        {"x": [1, "a" * 1000]},
        {"x": [[1], 2]},
        {"x": {"shape": [2], "dtype": "float32", "data": ["1", 2]}},
    ):
        with pytest.raises(eas.InvalidInput, match="input 'x'"):
            eas.decode_request(json.dumps({"inputs": bad}).encode())
    deep = b'{"inputs": {"x": ' + b"[" * 40 + b"1" + b"]" * 40 + b"}}"
    with pytest.raises(eas.InvalidInput, match="dimensions"):
        eas.decode_request(deep)
    with pytest.raises(eas.InvalidInput):
        eas.decode_request(b'{"inputs": {"x": ' + b"[" * 100_000 + b"}}")


def test_json_form() -> None:
    req = eas.decode_request(
        b'{"inputs": {"x": [[1, 2], [3, 4]], "y": {"shape": [2], "dtype": "int64", "data": [5, 6]}},'
        b' "outputs": ["o"]}'
    )
    assert req.kind == "json" and req.output_names == ["o"]
    assert req.named["x"].loose and req.named["x"].array.shape == (2, 2)
    assert not req.named["y"].loose and req.named["y"].array.dtype == np.int64
    for bad in (
        b'{"inputs": {"x": [[1, 2], [3]]}}',
        b'{"inputs": 3}',
        b"{" * 5000,
        b'{"inputs": {"x": "a"}}',
    ):
        with pytest.raises(eas.InvalidInput):
            eas.decode_request(bad)
    body = eas.encode_json_response(
        [
            ("p", np.array([[0.5, np.nan]], np.float32)),
            ("l", np.array([3], np.int64)),
            ("s", np.array([b"a"], object)),
        ]
    )
    doc = json.loads(body)
    assert doc == {
        "outputs": {
            "p": {"dtype": "float32", "shape": [1, 2], "data": [0.5, None]},
            "l": {"dtype": "int64", "shape": [1], "data": [3]},
            "s": {"dtype": "string", "shape": [1], "data": ["a"]},
        }
    }


SPECS = [
    eas.TensorSpec("x", np.dtype(np.float32), ("N", 4)),
    eas.TensorSpec("y", np.dtype(np.int64), ("N", 4)),
]


def _tf(**inputs: np.ndarray) -> bytes:
    msg = tf_predict_pb2.PredictRequest(signature_name="s")
    for name, arr in inputs.items():
        a = msg.inputs[name]
        a.array_shape.dim.extend(arr.shape)
        if arr.dtype == np.float32:
            a.dtype = tf_predict_pb2.DT_FLOAT
            a.float_val.extend(arr.ravel().tolist())
        else:
            a.dtype = tf_predict_pb2.DT_INT64
            a.int64_val.extend(arr.ravel().tolist())
    return msg.SerializeToString()


def test_dtype_and_shape_errors_name_the_input() -> None:
    good = eas.decode_request(_tf(x=np.zeros((3, 4), np.float32), y=np.zeros((3, 4), np.int64)))
    feeds = eas.bind_inputs(good, SPECS)
    assert feeds["x"].shape == (3, 4)
    wrong_dtype = eas.decode_request(_tf(x=np.zeros((3, 5), np.int64), y=np.zeros((3, 4), np.int64)))
    with pytest.raises(eas.InvalidInput) as exc:
        eas.bind_inputs(wrong_dtype, SPECS)
    assert exc.value.message == "input 'x': expected float32[N,4], got int64[3,5]"
    wrong_rank = eas.decode_request(_tf(x=np.zeros((12,), np.float32), y=np.zeros((3, 4), np.int64)))
    with pytest.raises(eas.InvalidInput, match=r"input 'x': expected float32\[N,4\], got float32\[12\]"):
        eas.bind_inputs(wrong_rank, SPECS)
    missing = eas.decode_request(_tf(x=np.zeros((3, 4), np.float32)))
    with pytest.raises(eas.InvalidInput, match="missing input 'y'"):
        eas.bind_inputs(missing, SPECS)
    extra = eas.decode_request(
        _tf(x=np.zeros((1, 4), np.float32), y=np.zeros((1, 4), np.int64), q=np.zeros((1,), np.float32))
    )
    with pytest.raises(eas.InvalidInput, match="unknown input 'q'"):
        eas.bind_inputs(extra, SPECS)
    # Loose (JSON list) inputs are cast when safe: ints to the model's float input.
    loose = eas.decode_request(b'{"inputs": {"x": [[1, 2, 3, 4]], "y": [[1, 2, 3, 4]]}}')
    feeds = eas.bind_inputs(loose, SPECS)
    assert feeds["x"].dtype == np.float32 and feeds["y"].dtype == np.int64
    # ... but floats never become ints silently.
    with pytest.raises(eas.InvalidInput, match="expected int64"):
        eas.bind_inputs(eas.decode_request(b'{"inputs": {"x": [[1,2,3,4]], "y": [[1.5,2,3,4]]}}'), SPECS)


def test_arrays_by_name_are_checked_as_named_inputs_are() -> None:
    """A server's own decoded arrays (V2, gRPC) get the named inputs' checks and messages,
    and are never cast: their dtype was stated on the wire."""
    x, y = np.zeros((3, 4), np.float32), np.zeros((3, 4), np.int64)
    feeds = eas.bind_arrays({"y": y, "x": x}, SPECS)
    assert list(feeds) == ["x", "y"] and feeds["x"] is x
    with pytest.raises(eas.InvalidInput) as exc:
        eas.bind_arrays({"x": x.astype(np.float64), "y": y}, SPECS)
    assert exc.value.message == "input 'x': expected float32[N,4], got float64[3,4]"
    with pytest.raises(eas.InvalidInput, match=r"input 'y': expected int64\[N,4\], got int64\[3\]"):
        eas.bind_arrays({"x": x, "y": np.zeros(3, np.int64)}, SPECS)
    with pytest.raises(eas.InvalidInput, match=r"missing input 'y' \(int64\[N,4\]\)"):
        eas.bind_arrays({"x": x}, SPECS)
    with pytest.raises(eas.InvalidInput, match="unknown input 'q'; model inputs: x, y"):
        eas.bind_arrays({"x": x, "y": y, "q": x}, SPECS)
    one = [eas.TensorSpec("x", np.dtype(np.float32), (-1, 4))]
    with pytest.raises(eas.InvalidInput, match="unknown input 'z'; model inputs: x"):
        eas.bind_arrays({"z": x}, one)
    assert eas.output_positions(["c", "a"], ["a", "b", "c"]) == [2, 0]
    with pytest.raises(eas.InvalidInput, match="unknown output 'zz'; model outputs: a, b, c"):
        eas.output_positions(["a", "zz"], ["a", "b", "c"])


def test_a_dtype_equal_to_the_models_is_taken_whatever_object_it_is() -> None:
    # A dtype swapped back to this machine's byte order, or one that carries metadata, is
    # equal to numpy's own float32 but not the same object.
    spec = [eas.TensorSpec("x", np.dtype(np.float32), (-1, 4))]
    for dtype in (np.dtype(">f4").newbyteorder(), np.dtype(np.float32, metadata={"m": 1})):
        assert dtype is not np.dtype(np.float32) and dtype == np.dtype(np.float32)
        x = np.zeros((2, 4), dtype)
        assert eas.bind_arrays({"x": x}, spec)["x"] is x


def test_output_selection() -> None:
    names = ["a", "b", "c"]
    tf = tf_predict_pb2.PredictRequest(signature_name="s", output_filter=["c", "a"])
    assert eas.select_outputs(eas.decode_request(tf.SerializeToString(), "tf"), names) == [2, 0]
    tf.output_filter.append("zz")
    with pytest.raises(eas.InvalidInput, match="unknown output 'zz'"):
        eas.select_outputs(eas.decode_request(tf.SerializeToString(), "tf"), names)
    torch = torch_predict_pb2.PredictRequest(output_filter=[1])
    assert eas.select_outputs(eas.decode_request(torch.SerializeToString(), "torch"), names) == [1]
    torch.output_filter.append(7)
    with pytest.raises(eas.InvalidInput, match="output index 7 out of range"):
        eas.select_outputs(eas.decode_request(torch.SerializeToString(), "torch"), names)


def test_encoders_round_trip_through_generated_messages() -> None:
    arrays = {
        "f": np.arange(6, dtype=np.float32).reshape(2, 3),
        "d": np.array([1.5, -2.5]),
        "i": np.array([[-1, 2]], np.int32),
        "l": np.array([2**40, -3], np.int64),
        "u8": np.array([0, 200, 255], np.uint8),
        "b": np.array([True, False]),
        "s": np.array([b"x", b"yz"], object),
    }
    tf = tf_predict_pb2.PredictResponse.FromString(eas.encode_tf_response(arrays.items()))
    assert list(tf.outputs["f"].float_val) == list(range(6)) and list(tf.outputs["f"].array_shape.dim) == [
        2,
        3,
    ]
    assert list(tf.outputs["d"].double_val) == [1.5, -2.5]
    assert list(tf.outputs["i"].int_val) == [-1, 2]
    assert list(tf.outputs["l"].int64_val) == [2**40, -3]
    assert tf.outputs["u8"].dtype == tf_predict_pb2.DT_INT32 and list(tf.outputs["u8"].int_val) == [
        0,
        200,
        255,
    ]
    assert list(tf.outputs["b"].bool_val) == [True, False]
    assert list(tf.outputs["s"].string_val) == [b"x", b"yz"]
    torch = torch_predict_pb2.PredictResponse.FromString(eas.encode_torch_response(arrays.values()))
    assert [o.dtype for o in torch.outputs][-2:] == [torch_predict_pb2.DT_INT32, torch_predict_pb2.DT_STRING]
    assert list(torch.outputs[5].int_val) == [1, 0]
    blade = blade_pb2.Response.FromString(
        eas.encode_blade_response(eas.blade_outputs(list(arrays.items()), {"l": blade_pb2.DT_FLOAT}))
    )
    by = {o.name_in_dl_model: o for o in blade.outputs}
    assert by["f"].batchsize == 2 and list(by["f"].float_val) == list(range(6))
    assert list(by["l"].float_val) == [float(2**40), -3.0]  # cast to the requested data_type
    assert list(by["i"].int_val) == [-1, 2] and list(by["s"].string_val) == [b"x", b"yz"]


@pytest.mark.compat
def test_reference_client_reads_our_responses() -> None:
    arrays = [
        ("probabilities", np.array([[0.25, 0.75]], np.float32)),
        ("label", np.array([1], np.int64)),
        ("mask", np.array([1, 0], np.uint8)),
    ]
    bodies = {
        "tf": eas.encode_tf_response(arrays).hex(),
        "torch": eas.encode_torch_response([a for _, a in arrays]).hex(),
        "blade": eas.encode_blade_response(eas.blade_outputs([arrays[0]], {})).hex(),
    }
    code = r"""
import json, sys
from eas_prediction import TFRequest, TorchRequest, BladeRequest
b = json.loads(sys.stdin.read())
tf = TFRequest('s').parse_response(bytes.fromhex(b['tf']))
torch = TorchRequest().parse_response(bytes.fromhex(b['torch']))
blade = BladeRequest('s').parse_response(bytes.fromhex(b['blade']))
print(json.dumps({
  'tf': [list(tf.get_values('probabilities')), list(tf.get_values('label')), list(tf.get_values('mask')),
         tf.get_tensor_shape('probabilities')],
  'torch': [list(torch.get_values(0)), list(torch.get_values(1)), list(torch.get_values(2)), torch.get_tensor_shape(0)],
  'blade': [list(blade.get_values('probabilities', BladeRequest.DT_FLOAT)), blade.get_tensor_shape('probabilities')],
}))
"""
    out = json.loads(run_reference(code, input_bytes=json.dumps(bodies).encode()).stdout)
    assert out["tf"] == [[0.25, 0.75], [1], [1, 0], [1, 2]]
    assert out["torch"] == [[0.25, 0.75], [1], [1, 0], [1, 2]]
    assert out["blade"] == [[0.25, 0.75], [1, 2]]


def test_encode_response_answers_in_the_request_format() -> None:
    """A server's encode_response writes the codec's TF/Torch/Blade bytes for the selected outputs."""
    outs = {
        "p": np.random.default_rng(1).random((2, 10), dtype=np.float32),
        "l": np.array([3, -4], np.int64),
        "d": np.array([0.5, 1e300]),
        "i": np.array([[1, -2, 3]], np.int32),
        "s": np.array([b"ab", b""], object),
    }
    names, arrays = list(outs), list(outs.values())
    tf = eas.DecodedRequest("tf")
    assert eas.encode_response(tf, names, arrays, [0, 1, 2, 3, 4]) == (
        eas.encode_tf_response(outs),
        eas.CONTENT_TYPE_PROTOBUF,
    )
    torch = eas.DecodedRequest("torch")
    assert eas.encode_response(torch, names, arrays, [0, 1, 2])[0] == eas.encode_torch_response(arrays[:3])
    by_map = eas.DecodedRequest("torch", by_map=True)
    assert eas.encode_response(by_map, names, arrays, [1])[0] == eas.encode_torch_response(
        (), {"l": outs["l"]}
    )
    # uint64 outputs travel as their int64 bits; a complex output cannot be encoded.
    big = np.array([2**64 - 1], np.uint64)
    body = eas.encode_response(tf, ["u"], [big], [0])[0]
    assert list(tf_predict_pb2.PredictResponse.FromString(body).outputs["u"].int64_val) == [-1]
    with pytest.raises(eas.InvalidInput, match="cannot encode"):
        eas.encode_response(tf, ["c"], [np.array([1j])], [0])


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.uint32]),
    st.lists(st.integers(-(2**63), 2**64 - 1), max_size=40),
    st.booleans(),
)
def test_integer_outputs_are_byte_identical_to_protobuf(dtype: type, values: list[int], torch: bool) -> None:
    """Packed varints written by hand (small and numpy paths) equal protobuf's own encoding."""
    info = np.iinfo(dtype)
    arr = np.array([v for v in values if info.min <= v <= info.max], dtype=dtype)
    family = "torch" if torch else "tf"
    got = b"".join(eas.response_array(arr, family, "x")[0])
    module = torch_predict_pb2 if torch else tf_predict_pb2
    dt = eas.dt_for_numpy(arr.dtype, family, response=True)  # the dtype mapping is tested above
    wire = arr.astype(np.int64)
    want = module.ArrayProto(dtype=dt)
    want.array_shape.dim.extend(arr.shape)
    if dt == module.DT_INT64:
        want.int64_val.extend(wire.tolist())
    else:
        want.int_val.extend(wire.tolist())
    assert got == want.SerializeToString()


def test_blade_bodies_follow_the_generated_parser() -> None:
    """Blade requests decode as protobuf's own parser reads them: names stripped, a value
    without a shape is a scalar, the populated field gives the dtype."""
    msg = blade_pb2.Request(tf_signature_name="sig")
    msg.inputs.add(name_in_dl_model=" a ", batchsize=1, int64_val=[7])
    b = msg.inputs.add(blade_blob_name="b", batchsize=2, string_val=[b"x", b"y"])
    b.shape.dim.extend([2, 1])
    msg.inputs.add(name_in_dl_model="e", batchsize=1)  # no values: an empty float vector
    msg.output_info.add(blade_blob_name=" out ", data_type=blade_pb2.DT_INT64)
    req = eas.decode_request(msg.SerializeToString(), "blade")
    assert req.signature == "sig" and list(req.named) == ["a", "b", "e"]
    assert req.named["a"].array.shape == () and req.named["a"].array.dtype == np.int64
    assert req.named["b"].array.tolist() == [[b"x"], [b"y"]]
    assert req.named["e"].array.dtype == np.float32 and req.named["e"].array.shape == (0,)
    assert req.output_names == ["out"] and req.output_types == {"out": blade_pb2.DT_INT64}
    # An output_info data_type outside the enum reads as DT_UNKNOWN, as protobuf reads it.
    odd = b"\x1a\x07\x12\x03out\x18\x09"
    assert eas.decode_request(odd, "blade").output_types == {"out": blade_pb2.DT_UNKNOWN}
    # protobuf's parser does not insist on the required batchsize, and neither does the server.
    assert eas.decode_request(b"\x12\x04\x12\x02in", "blade").named["in"].array.shape == (0,)
