"""gateway.codecs.kserve without a server: metadata, model configuration and statistics
answers (model metadata itself comes from the processor: tests/gateway/workers/test_metadata.py)."""

from __future__ import annotations

import json

from gateway.codecs import kserve as proto
from gateway.core.metadata import ModelMetadata, TensorSpec


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
