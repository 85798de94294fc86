"""gateway.protocols.kserve without a server: request validation and answer building
(model metadata itself comes from the processor: tests/gateway/workers/test_metadata.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gateway.protocols import kserve as proto
from gateway.workers.metadata import ModelMetadata, TensorSpec


def _v2(inputs: list[dict], **extra: object) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def test_v2_request_becomes_the_processor_json_form() -> None:
    req = proto.parse_v2_infer(
        _v2(
            [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]}],
            id="r-1",
            outputs=[{"name": "y"}],
        )
    )
    assert req.id == "r-1" and req.outputs == ("y",)
    assert json.loads(req.body) == {
        "inputs": {"x": {"shape": [2, 2], "dtype": "float32", "data": [1, 2, 3, 4]}},
        "outputs": ["y"],
    }


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
        (
            [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}] * 2,
            "input 'x': given twice",
        ),
        (
            [
                {
                    "name": "x",
                    "shape": [1],
                    "datatype": "FP32",
                    "data": [],
                    "parameters": {"binary_data_size": 4},
                }
            ],
            "binary tensor data extension",
        ),
    ],
)
def test_v2_bad_requests_name_the_problem(inputs: list[dict], message: str) -> None:
    with pytest.raises(proto.KServeRequestError, match=message) as info:
        proto.parse_v2_infer(_v2(inputs))
    assert info.value.status == 400


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"inputs": 3}', b"\xff", b"[" * 100_000])
def test_v2_malformed_bodies_are_400(body: bytes) -> None:
    with pytest.raises(proto.KServeRequestError) as info:
        proto.parse_v2_infer(body)
    assert info.value.status == 400


def test_v2_response_keeps_the_requested_output_order_and_the_id() -> None:
    reply = json.dumps(
        {
            "outputs": {
                "a": {"dtype": "int64", "shape": [2], "data": [1, 2]},
                "b": {"dtype": "string", "shape": [1], "data": ["x"]},
            }
        }
    ).encode()
    req = proto.V2Request("id-7", b"", ("b", "a"))
    doc = json.loads(proto.v2_response("m", req, reply))
    assert doc["id"] == "id-7" and doc["model_name"] == "m"
    assert [(o["name"], o["datatype"], o["shape"], o["data"]) for o in doc["outputs"]] == [
        ("b", "BYTES", [1], ["x"]),
        ("a", "INT64", [2], [1, 2]),
    ]


def test_v1_instances_map_to_the_single_input_and_predictions_split_by_row() -> None:
    sig = ModelMetadata((TensorSpec("x", "FP32", (-1, 2)),), (TensorSpec("y", "FP32", (-1, 2)),))
    req = proto.parse_v1_predict(b'{"instances": [[1, 2], [3, 4], [5, 6]]}', sig)
    assert req.size == 3
    assert json.loads(req.body) == {"inputs": {"x": [[1, 2], [3, 4], [5, 6]]}}
    y = np.arange(6, dtype=np.float32).reshape(3, 2)
    reply = json.dumps({"outputs": {"y": {"dtype": "float32", "shape": [3, 2], "data": y.ravel().tolist()}}})
    assert json.loads(proto.v1_predictions(req, reply.encode())) == {"predictions": y.tolist()}


def test_v1_inputs_in_row_and_column_form() -> None:
    one = ModelMetadata((TensorSpec("x", "FP32", (-1, 2)),), (TensorSpec("y", "FP32", (-1, 2)),))
    req = proto.parse_v1_predict(b'{"inputs": [[1, 2], [3, 4]]}', one)
    assert (req.size, json.loads(req.body)) == (2, {"inputs": {"x": [[1, 2], [3, 4]]}})
    two = ModelMetadata(
        (TensorSpec("a", "FP32", (-1,)), TensorSpec("b", "INT64", (-1,))), (TensorSpec("s", "FP32", (-1,)),)
    )
    req = proto.parse_v1_predict(b'{"inputs": {"b": [2, 3], "a": [1.5, 0.5]}}', two)
    assert (req.size, json.loads(req.body)) == (2, {"inputs": {"a": [1.5, 0.5], "b": [2, 3]}})
    for bad, message in (
        (b'{"inputs": {"a": [1]}}', r"names \['a'\]"),
        (b'{"inputs": {"a": [1], "b": [1, 2]}}', "one length"),
        (b'{"inputs": {"a": 1, "b": 2}}', "one length"),
        (b'{"inputs": []}', "non-empty"),
        (b"[1, 2]", "non-empty"),
    ):
        with pytest.raises(proto.KServeRequestError, match=message):
            proto.parse_v1_predict(bad, two)


def test_v1_named_instances_for_a_multi_input_model() -> None:
    sig = ModelMetadata(
        (TensorSpec("a", "FP32", (-1,)), TensorSpec("b", "INT64", (-1,))),
        (TensorSpec("s", "FP32", (-1,)), TensorSpec("t", "FP32", (1,))),
    )
    req = proto.parse_v1_predict(b'{"instances": [{"a": 1.5, "b": 2}, {"b": 3, "a": 0.5}]}', sig)
    assert json.loads(req.body) == {"inputs": {"a": [1.5, 0.5], "b": [2, 3]}}
    reply = json.dumps(
        {
            "outputs": {
                "s": {"dtype": "float32", "shape": [2], "data": [3.5, 3.5]},
                "t": {"dtype": "float32", "shape": [1], "data": [9.0]},  # not per instance: repeated
            }
        }
    ).encode()
    assert json.loads(proto.v1_predictions(req, reply)) == {
        "predictions": [{"s": 3.5, "t": [9.0]}, {"s": 3.5, "t": [9.0]}]
    }
    with pytest.raises(proto.KServeRequestError, match="each instance must be an object"):
        proto.parse_v1_predict(b'{"instances": [[1, 2]]}', sig)
    with pytest.raises(proto.KServeRequestError, match=r"names inputs \['a'\]"):
        proto.parse_v1_predict(b'{"instances": [{"a": 1}]}', sig)


def test_v2_metadata_answer() -> None:
    meta = ModelMetadata(
        (TensorSpec("x", "FP32", (-1, 4)), TensorSpec("n", "INT64", (-1, 4))),
        (TensorSpec("y", "UINT8", (-1,)),),
        platform="onnxruntime_onnx",
    )
    body = proto.v2_metadata("multi", meta)
    assert body == (
        b'{"name":"multi","versions":["1"],"platform":"onnxruntime_onnx",'
        b'"inputs":[{"name":"x","datatype":"FP32","shape":[-1,4]},{"name":"n","datatype":"INT64","shape":[-1,4]}],'
        b'"outputs":[{"name":"y","datatype":"UINT8","shape":[-1]}]}'
    )


def test_triton_model_config() -> None:
    meta = ModelMetadata(
        (TensorSpec("x", "FP32", (-1, 64)), TensorSpec("s", "BYTES", (-1,))),
        (TensorSpec("y", "INT64", (-1,)),),
        platform="onnxruntime_onnx",
    )
    plain = json.loads(proto.triton_config("m", meta, workers=2, max_batch_size=0, queue_delay_ms=0))
    assert plain["platform"] == "onnxruntime_onnx" and plain["backend"] == "onnxruntime"
    assert plain["max_batch_size"] == 0 and "dynamic_batching" not in plain
    assert plain["input"] == [
        {"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 64]},
        {"name": "s", "data_type": "TYPE_STRING", "dims": [-1]},
    ]
    assert plain["instance_group"] == [{"name": "m", "kind": "KIND_CPU", "count": 2}]
    batched = json.loads(proto.triton_config("m", meta, workers=1, max_batch_size=32, queue_delay_ms=2.5))
    assert batched["max_batch_size"] == 32
    assert batched["dynamic_batching"] == {"max_queue_delay_microseconds": 2500}
    # With batching the batch dimension is implicit, as in Triton.
    assert batched["input"][0]["dims"] == [64] and batched["output"][0]["dims"] == []
