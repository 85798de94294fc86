"""OnnxRequest/OnnxResponse and OnnxDataHelper: byte-identical to eas-prediction 0.36."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eas_sdk import OnnxData, OnnxDataHelper, OnnxRequest, OnnxResponse
from tests.eas_reference import run_reference

DTYPES = ["float32", "uint8", "int8", "uint16", "int16", "int32", "int64", "float64", "uint32", "uint64"]


def _arrays() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    out = []
    for i, dt in enumerate(DTYPES):
        shape = (2, 3) if i % 2 else (4,)
        out.append((f"t_{dt}", (rng.random(shape) * 100).astype(dt)))
    out.append(("empty", np.zeros((0, 3), np.float32)))
    return out


def test_reference_client_vector() -> None:
    req = OnnxRequest()
    req.add_tensor(OnnxDataHelper.from_array(np.array([[1, 2]], np.float32), "x"))
    assert req.to_string().hex() == "0a130a01781202010218012a080000803f00000040"


def test_requests_match_reference_bytes_and_responses_decode() -> None:
    arrays = _arrays()
    spec = json.dumps([[name, arr.dtype.str, list(arr.shape), arr.tolist()] for name, arr in arrays])
    code = """
import json, sys
import numpy as np
from eas_prediction import OnnxRequest, OnnxDataHelper
spec = json.loads(sys.argv[1])
req = OnnxRequest()
for name, dt, shape, values in spec:
    req.add_tensor(OnnxDataHelper.from_array(np.array(values, dtype=dt).reshape(shape), name))
# the same name twice replaces the tensor in place
req.add_tensor(OnnxDataHelper.from_array(np.array([5, 6], dtype='int32'), spec[0][0]))
print(req.to_string().hex())
"""
    ref_hex = run_reference(code, spec).stdout.decode().strip()
    req = OnnxRequest()
    for name, arr in arrays:
        req.add_array(name, arr)
    assert req.add_tensor(OnnxDataHelper.from_array(np.array([5, 6], np.int32), arrays[0][0])) == 0
    assert req.to_string().hex() == ref_hex

    # The reference body read back as a response: every tensor comes back with its dtype and shape.
    resp = OnnxResponse(bytes.fromhex(ref_hex))
    assert resp.get_size() == len(arrays)
    np.testing.assert_array_equal(resp.to_numpy(0), np.array([5, 6], np.int32))
    for i, (name, arr) in enumerate(arrays[1:], start=1):
        assert resp.get_name(i) == name
        got = resp.to_numpy(name)
        assert got.dtype == arr.dtype and got.shape == arr.shape
        np.testing.assert_array_equal(got, arr)
        assert isinstance(resp.get_tensor(i), OnnxData.TensorProto)


def test_bad_inputs_are_named() -> None:
    with pytest.raises(TypeError, match="'s'"):
        OnnxDataHelper.from_array(np.array(["a"]), "s")
    with pytest.raises(TypeError, match="TensorProto"):
        OnnxRequest().add_tensor(np.zeros(2))  # type: ignore[arg-type]
    bad = OnnxData.TensorProto(name="x", dims=[3], data_type=OnnxData.TensorProto.FLOAT, raw_data=b"\0" * 8)
    with pytest.raises(ValueError, match="'x'"):
        OnnxDataHelper.to_array(bad)
