"""gateway.codecs.v2_infer, v2_binary and v2_classification without a server: V2 requests
(JSON, binary and mixed) to arrays, arrays to V2 answers."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from gateway.codecs import v2_infer as proto
from gateway.codecs.kserve import KServeRequestError
from gateway.codecs.v2_classification import classify


def _v2(inputs: list[dict], **extra: object) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def _binary(doc: dict, *chunks: bytes) -> tuple[bytes, str]:
    header = json.dumps(doc).encode()
    return header + b"".join(chunks), str(len(header))


def test_json_request_becomes_arrays_in_the_declared_dtypes() -> None:
    req = proto.parse_request(
        _v2(
            [
                {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4.5]]},
                {"name": "n", "shape": [2], "datatype": "INT64", "data": [-1, 1 << 40]},
                {"name": "s", "shape": [1], "datatype": "BYTES", "data": ["héllo"]},
                {"name": "b", "shape": [2], "datatype": "BOOL", "data": [True, False]},
            ],
            id="r-1",
            outputs=[{"name": "y"}, {"name": "z", "parameters": {"binary_data": True, "classification": 2}}],
        )
    )
    assert req.id == "r-1" and req.output_names == ("y", "z") and not req.binary_output
    assert req.outputs[1] == proto.RequestedOutput("z", True, 2)
    x, n, s, b = (req.inputs[k] for k in "xnsb")
    assert x.dtype == np.float32 and x.tolist() == [[1, 2], [3, 4.5]]
    assert n.dtype == np.int64 and n.tolist() == [-1, 1 << 40]
    assert s.dtype == object and s.tolist() == ["héllo".encode()]
    assert b.dtype == np.bool_ and b.tolist() == [True, False]
    assert req.parameters == {}


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_a_flat_float_tensor_is_read_as_numpy_reads_the_numbers(datatype: str) -> None:
    values = [0.1, -2.5, 3, True, 1e-300, 2049, 65504.0, 7]  # 2049: no FP16 holds it, it rounds
    req = proto.parse_request(_v2([{"name": "x", "shape": [2, 4], "datatype": datatype, "data": values}]))
    x = req.inputs["x"]
    expected = np.asarray(values).astype(x.dtype).reshape(2, 4)
    assert x.dtype == proto.v2_tensors.DATATYPES[datatype] and x.shape == (2, 4)
    assert x.tobytes() == expected.tobytes()  # bit for bit, every value rounded as numpy rounds it
    x[0, 0] = 9  # the model gets an array of its own, which it may write to
    nested = proto.parse_request(_v2([{"name": "x", "shape": [2, 4], "datatype": datatype,
                                       "data": [values[:4], values[4:]]}]))  # fmt: skip
    assert nested.inputs["x"].tobytes() == expected.tobytes()


def test_a_float_tensor_past_what_struct_reads_is_read_by_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    packed: list[str] = []  # the formats struct was asked to read: not past the cap
    pack_into = struct.pack_into
    monkeypatch.setattr(proto.struct, "pack_into", lambda fmt, *a: (packed.append(fmt), pack_into(fmt, *a)))
    values = [i / 7 for i in range(proto.STRUCT_MAX_VALUES + 1)]
    for n in (len(values) - 1, len(values)):
        req = proto.parse_request(_v2([{"name": "x", "shape": [n], "datatype": "FP32", "data": values[:n]}]))
        assert req.inputs["x"].tobytes() == np.asarray(values[:n]).astype(np.float32).tobytes()
    assert packed == [f"{proto.STRUCT_MAX_VALUES}d"]


@pytest.mark.parametrize("bad", ["1.5", None, {"v": 1.5}])
def test_a_flat_float_tensor_with_a_value_that_is_no_number_is_refused(bad: object) -> None:
    body = _v2([{"name": "x", "shape": [3], "datatype": "FP32", "data": [1.0, bad, 2.0]}])
    with pytest.raises(KServeRequestError, match="input 'x'") as info:
        proto.parse_request(body)
    assert info.value.status == 400


def test_the_request_parameters_are_kept_as_sent() -> None:
    x = [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]
    params = {"binary_data_output": True, "top": 3, "mode": "fast", "cut": 0.5}
    req = proto.parse_request(_v2(x, parameters=params))
    assert req.binary_output and req.parameters == params


def test_binary_inputs_are_views_over_the_body_and_mix_with_json() -> None:
    x = np.arange(6, dtype="<f4").reshape(2, 3)
    words = [b"ab", b"", "ü".encode()]
    packed = b"".join(struct.pack("<I", len(w)) + w for w in words)
    doc = {
        "inputs": [
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}},
            {"name": "n", "shape": [1], "datatype": "INT64", "data": [7]},
            {"name": "s", "shape": [3], "datatype": "BYTES", "parameters": {"binary_data_size": len(packed)}},
        ],
        "parameters": {"binary_data_output": True},
    }
    body, hlen = _binary(doc, x.tobytes(), packed)
    req = proto.parse_request(body, hlen)
    assert req.binary_output
    got = req.inputs["x"]
    np.testing.assert_array_equal(got, x)
    # No copy: the array's memory is the received body's.
    assert np.shares_memory(got, np.frombuffer(body, dtype=np.uint8))
    assert req.inputs["n"].tolist() == [7] and req.inputs["s"].tolist() == words


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([], '"inputs" must be a non-empty list'),
        (
            [{"name": "x", "shape": [2], "datatype": "FLOAT", "data": [1, 2]}],
            "datatype 'FLOAT' is not one of",
        ),
        ([{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3]}], "needs 4 values, got 3"),
        ([{"name": "x", "shape": [-1], "datatype": "FP32", "data": []}], "non-negative integers"),
        ([{"name": "x", "shape": [1 << 20, 1 << 20], "datatype": "FP32", "data": []}], "more than"),
        ([{"name": "x", "shape": [1], "datatype": "FP32", "data": "1"}], "data must be a list"),
        ([{"shape": [1], "datatype": "FP32", "data": [1]}], "name must be a non-empty string"),
        ([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}] * 2, "input 'x': given twice"),
        ([{"name": "x", "shape": [2], "datatype": "INT64", "data": [1, 2.5]}], "not all INT64 values"),
        ([{"name": "x", "shape": [1], "datatype": "INT8", "data": [300]}], "not all INT8 values"),
        ([{"name": "x", "shape": [1], "datatype": "FP32", "data": ["a"]}], "not all FP32 values"),
        ([{"name": "x", "shape": [1], "datatype": "BOOL", "data": [1]}], "not all BOOL values"),
        ([{"name": "x", "shape": [1], "datatype": "BYTES", "data": [1]}], "BYTES data must be strings"),
        (
            [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}],
            "binary_data_size needs the Inference-Header-Content-Length header",
        ),
        (
            [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"shared_memory_region": "r"}}],
            "shared memory extension is not supported",
        ),
    ],
)
def test_bad_requests_name_the_problem(inputs: list[dict], message: str) -> None:
    with pytest.raises(KServeRequestError, match=message) as info:
        proto.parse_request(_v2(inputs))
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("size", "chunk", "message"),
    [
        (8, b"\0" * 4, "binary_data_size is 8, only 4 binary bytes remain"),
        (4, b"\0" * 8, "4 bytes of binary data follow the last binary tensor"),
        (8, b"\0" * 8, r"FP32 shape \[1\] needs 4 bytes, got 8"),
        (-1, b"", "non-negative integer"),
    ],
)
def test_bad_binary_sections_name_the_problem(size: int, chunk: bytes, message: str) -> None:
    doc = {
        "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": size}}]
    }
    body, hlen = _binary(doc, chunk)
    with pytest.raises(KServeRequestError, match=message):
        proto.parse_request(body, hlen)
    for bad in ("x", "0", str(len(body) + 1)):
        with pytest.raises(KServeRequestError, match="Inference-Header-Content-Length"):
            proto.parse_request(body, bad)


def test_bad_outputs_name_the_problem() -> None:
    x = [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]
    for outputs, message in (
        ([{"name": "y"}, {"name": "y"}], "requested twice"),
        ([{"name": "y", "parameters": {"classification": "3"}}], "classification extension"),
        ([{"name": "y", "parameters": {"binary_data": "yes"}}], "must be true or false"),
        ({"name": "y"}, '"outputs" must be a list'),
    ):
        with pytest.raises(KServeRequestError, match=message):
            proto.parse_request(_v2(x, outputs=outputs))


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"inputs": 3}', b"\xff", b"[" * 100_000])
def test_malformed_bodies_are_400(body: bytes) -> None:
    with pytest.raises(KServeRequestError) as info:
        proto.parse_request(body)
    assert info.value.status == 400


def test_answer_in_json_binary_or_both() -> None:
    arrays = {
        "a": np.array([1, 2], dtype=np.int64),
        "b": np.array([b"x", b"yz"], dtype=object),
        "c": np.array([[0.5, 2.0]], dtype=np.float32),
    }
    req = proto.InferRequest("id-7", {}, (proto.RequestedOutput("b"), proto.RequestedOutput("a")))
    body, hlen = proto.answer("m", "3", req, arrays)
    doc = json.loads(body)
    assert hlen is None and doc["id"] == "id-7" and doc["model_name"] == "m" and doc["model_version"] == "3"
    assert [(o["name"], o["datatype"], o["shape"], o["data"]) for o in doc["outputs"]] == [
        ("b", "BYTES", [2], ["x", "yz"]),
        ("a", "INT64", [2], [1, 2]),
    ]
    # binary_data_output for all, in the model's order, one output asking for JSON.
    req = proto.InferRequest(None, {}, (), binary_output=True)
    body, hlen = proto.answer("m", "1", req, arrays, ["c", "a", "b"])
    assert hlen is not None
    head = json.loads(body[:hlen])
    assert [o["name"] for o in head["outputs"]] == ["c", "a", "b"]
    sizes = [o["parameters"]["binary_data_size"] for o in head["outputs"]]
    assert sizes == [8, 16, 4 + 1 + 4 + 2] and len(body) == hlen + sum(sizes)
    assert np.frombuffer(body[hlen : hlen + 8], "<f4").tolist() == [0.5, 2.0]
    assert body[hlen + 24 :] == b"\x01\0\0\0x\x02\0\0\0yz"
    req = proto.InferRequest(None, {}, (proto.RequestedOutput("a", False), proto.RequestedOutput("c")), True)
    body, hlen = proto.answer("m", "1", req, arrays)
    head = json.loads(body[:hlen])
    assert head["outputs"][0]["data"] == [1, 2] and "data" not in head["outputs"][1]


def test_classification_is_the_top_k_as_triton_prints_it() -> None:
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], dtype=np.float32)
    assert classify(scores, 2, "o").tolist() == [
        [b"0.700000:1", b"0.200000:2"],
        [b"0.500000:0", b"0.250000:1"],
    ]
    assert classify(np.array([3, 9, 1]), 5, "o", ["a", "b", "c"]).tolist() == [b"9:1:b", b"3:0:a", b"1:2:c"]
    req = proto.InferRequest(None, {}, (proto.RequestedOutput("p", None, 1),))
    doc = json.loads(proto.answer("m", "1", req, {"p": scores})[0])
    assert doc["outputs"] == [
        {"name": "p", "datatype": "BYTES", "shape": [2, 1], "data": ["0.700000:1", "0.500000:0"]}
    ]
    with pytest.raises(KServeRequestError, match="numeric output"):
        classify(np.array([b"x"], dtype=object), 1, "o")
