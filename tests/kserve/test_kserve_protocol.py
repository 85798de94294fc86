"""gateway.protocols.kserve without a server: model metadata read from the file (checked
against the onnx package), request validation, and answer building."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gateway.protocols import kserve as proto

ROOT = Path(__file__).resolve().parents[2]
_ONNX_TO_NAME = {
    TensorProto.FLOAT: "FP32",
    TensorProto.INT64: "INT64",
    TensorProto.DOUBLE: "FP64",
    TensorProto.UINT8: "UINT8",
    TensorProto.STRING: "BYTES",
    TensorProto.BOOL: "BOOL",
    TensorProto.INT32: "INT32",
    TensorProto.FLOAT16: "FP16",
}


def _expected(
    values: list[onnx.ValueInfoProto], skip: set[str] = frozenset()
) -> list[tuple[str, str, tuple]]:
    out = []
    for vi in values:
        if vi.name in skip:
            continue
        tt = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        out.append((vi.name, _ONNX_TO_NAME[tt.elem_type], dims))
    return out


@pytest.fixture(scope="module")
def models(digits_model: Path) -> list[Path]:
    return sorted((ROOT / "samples" / "models").glob("*.onnx"))


def test_signature_matches_the_onnx_package_for_every_sample_model(models: list[Path]) -> None:
    assert len(models) >= 3
    for path in models:
        model = onnx.load(str(path))
        inits = {t.name for t in model.graph.initializer}
        sig = proto.onnx_signature(path)
        assert [(t.name, t.datatype, t.shape) for t in sig.inputs] == _expected(model.graph.input, inits), (
            path
        )
        assert [(t.name, t.datatype, t.shape) for t in sig.outputs] == _expected(model.graph.output), path


def test_initializers_listed_as_inputs_are_not_inputs(tmp_path: Path) -> None:
    # IR < 4 models list their weights among the graph inputs.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])
    weights = helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 0.0, 0.0, 1.0])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x, w], [y], [weights])
    path = tmp_path / "old.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    sig = proto.onnx_signature(path)
    assert [t.name for t in sig.inputs] == ["x"]
    assert sig.inputs[0].shape == (-1, 2)


def test_a_file_that_is_not_onnx_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\xff\xff\xff\xff not a model")
    with pytest.raises(ValueError, match="not an ONNX model"):
        proto.onnx_signature(path)


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
    sig = proto.ModelSignature(
        (proto.TensorMeta("x", "FP32", (-1, 2)),), (proto.TensorMeta("y", "FP32", (-1, 2)),)
    )
    req = proto.parse_v1_predict(b'{"instances": [[1, 2], [3, 4], [5, 6]]}', sig)
    assert req.size == 3
    assert json.loads(req.body) == {"inputs": {"x": [[1, 2], [3, 4], [5, 6]]}}
    y = np.arange(6, dtype=np.float32).reshape(3, 2)
    reply = json.dumps({"outputs": {"y": {"dtype": "float32", "shape": [3, 2], "data": y.ravel().tolist()}}})
    assert json.loads(proto.v1_predictions(req, reply.encode())) == {"predictions": y.tolist()}


def test_v1_named_instances_for_a_multi_input_model() -> None:
    sig = proto.ModelSignature(
        (proto.TensorMeta("a", "FP32", (-1,)), proto.TensorMeta("b", "INT64", (-1,))),
        (proto.TensorMeta("s", "FP32", (-1,)), proto.TensorMeta("t", "FP32", (1,))),
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
