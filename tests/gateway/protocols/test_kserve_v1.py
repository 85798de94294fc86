"""gateway.codecs.kserve_v1 without a server: V1 requests in row and column form, and
predictions split by row."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gateway.codecs import kserve_v1 as proto
from gateway.codecs.kserve import KServeRequestError
from gateway.core.json_answer import processor_outputs
from gateway.core.metadata import ModelMetadata, TensorSpec


def test_v1_instances_map_to_the_single_input_and_predictions_split_by_row() -> None:
    sig = ModelMetadata((TensorSpec("x", "FP32", (-1, 2)),), (TensorSpec("y", "FP32", (-1, 2)),))
    req = proto.parse_v1_predict(b'{"instances": [[1, 2], [3, 4], [5, 6]]}', sig)
    assert req.size == 3
    assert json.loads(req.body) == {"inputs": {"x": [[1, 2], [3, 4], [5, 6]]}}
    y = np.arange(6, dtype=np.float32).reshape(3, 2)
    reply = json.dumps({"outputs": {"y": {"dtype": "float32", "shape": [3, 2], "data": y.ravel().tolist()}}})
    assert json.loads(proto.v1_predictions(req, processor_outputs(reply.encode()))) == {
        "predictions": y.tolist()
    }


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
        with pytest.raises(KServeRequestError, match=message):
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
    assert json.loads(proto.v1_predictions(req, processor_outputs(reply))) == {
        "predictions": [{"s": 3.5, "t": [9.0]}, {"s": 3.5, "t": [9.0]}]
    }
    with pytest.raises(KServeRequestError, match="each instance must be an object"):
        proto.parse_v1_predict(b'{"instances": [[1, 2]]}', sig)
    with pytest.raises(KServeRequestError, match=r"names inputs \['a'\]"):
        proto.parse_v1_predict(b'{"instances": [{"a": 1}]}', sig)
