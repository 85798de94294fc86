"""The raw V2 tensor form shared by the binary REST extension and gRPC."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from eas_sdk.codecs.eas import decode_tf_request, encode_tf_response
from gateway.codecs import v2_tensors as t


@pytest.mark.parametrize("datatype", [d for d in t.DATATYPES if d != "BYTES"])
def test_numeric_round_trip_is_a_view_over_the_buffer(datatype: str) -> None:
    arr = (np.arange(6) % 2).astype(t.DATATYPES[datatype]).reshape(2, 3)
    raw = bytes(t.to_raw(arr))
    assert len(raw) == arr.nbytes
    back = t.from_raw(raw, datatype, [2, 3], "input 'x'")
    assert back.dtype == t.DATATYPES[datatype] and back.shape == (2, 3)
    np.testing.assert_array_equal(back, arr)
    assert t.datatype_of(back) == datatype
    buf = bytearray(raw)
    assert np.shares_memory(t.from_raw(memoryview(buf), datatype, [2, 3], "x"), np.frombuffer(buf, np.uint8))


def test_bytes_elements_are_length_prefixed() -> None:
    arr = np.array([b"ab", b"", "\u00e9"], dtype=object)
    raw = bytes(t.to_raw(arr))
    n = struct.Struct("<I").pack
    assert raw == n(2) + b"ab" + n(0) + n(2) + "\u00e9".encode()
    back = t.from_raw(raw, "BYTES", [3], "x")
    assert back.tolist() == [b"ab", b"", "\u00e9".encode()]


@pytest.mark.parametrize(
    ("raw", "datatype", "shape", "needle"),
    [
        (b"\x00" * 7, "FP32", [2], "needs 8 bytes, got 7"),
        (b"\x00" * 8, "FP32", [-1], "non-negative"),
        (b"", "FP32", [1 << 20, 1 << 20], "more than"),
        (b"\x00" * 4, "COMPLEX", [1], "is not one of"),
        (b"\x02", "BOOL", [1], "0 or 1"),
        (struct.pack("<I", 5) + b"abc", "BYTES", [1], "says 5 bytes"),
        (struct.pack("<I", 1) + b"ab", "BYTES", [1], "left over"),
        (b"\x00" * 8, "BYTES", [1000], "cannot hold"),
        (struct.pack("<I", 2) + b"ab\x00\x00", "BYTES", [2], "cut short"),
    ],
)
def test_mismatches_name_the_tensor(raw: bytes, datatype: str, shape: list[int], needle: str) -> None:
    with pytest.raises(t.TensorError, match=needle) as info:
        t.from_raw(raw, datatype, shape, "input 'x'")
    assert "input 'x'" in str(info.value)


def test_tf_request_carries_inputs_and_the_output_subset() -> None:
    body = t.tf_request({"x": np.ones((1, 3), np.float32), "s": np.array([b"a"], dtype=object)}, ["y"])
    req = decode_tf_request(body)
    np.testing.assert_array_equal(req.inputs["x"].array, np.ones((1, 3), np.float32))
    assert req.inputs["s"].array.tolist() == [b"a"]
    assert list(req.output_filter) == ["y"]


def test_tf_outputs_narrow_back_to_the_models_dtypes() -> None:
    reply = encode_tf_response({"label": np.array([1, 2], np.uint8), "p": np.array([0.5], np.float32)})
    plain = t.tf_outputs(reply)
    assert plain["label"].dtype != np.uint8  # widened on the TF wire for old clients
    narrowed = t.tf_outputs(reply, {"label": np.dtype(np.uint8)})
    assert narrowed["label"].dtype == np.uint8 and narrowed["label"].tolist() == [1, 2]
    assert narrowed["p"].dtype == np.float32
