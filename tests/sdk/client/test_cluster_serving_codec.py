"""The Cluster Serving codec (I/O-free): how each input kind is encoded and results decoded."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest

from eas_sdk import PredictException
from eas_sdk._core.cluster_serving import (
    ClusterServingInputError,
    b64_image_bytes,
    sparse_to_coo,
    wire_to_tensor,
)
from eas_sdk.cluster_serving import decode_result, encode_instance
from eas_sdk.errors import BadRequestError
from gateway.codecs.cluster_serving import predictions_answer
from gateway.core.json_answer import processor_outputs


def _png(arr: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _inputs(body: bytes) -> dict[str, dict[str, object]]:
    doc = json.loads(body)
    assert set(doc) == {"inputs"}
    return doc["inputs"]  # type: ignore[no-any-return]


def test_each_kind_gets_a_batch_axis_of_one(tmp_path: Path) -> None:
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    (tmp_path / "i.png").write_bytes(_png(img))
    got = _inputs(
        encode_instance(
            {
                "words": ["hello", "world"],
                "one": "single",
                "t": np.array([[1.5, 2.0]], dtype=np.float32),
                "n": 7,
                "img": {"path": str(tmp_path / "i.png")},
                "img2": {"b64": base64.b64encode(_png(img)).decode()},
            }
        )
    )
    assert got["words"] == {"shape": [1, 2], "dtype": "string", "data": ["hello", "world"]}
    assert got["one"] == {"shape": [1, 1], "dtype": "string", "data": ["single"]}
    # numbers go without a dtype: the processor casts them to the model's input type
    assert got["t"] == {"shape": [1, 1, 2], "data": [1.5, 2.0]}
    assert got["n"] == {"shape": [1], "data": [7]}
    for name in ("img", "img2"):
        assert got[name]["shape"] == [1, 2, 3, 3]
        assert got[name]["data"] == img.reshape(-1).tolist()


def test_sparse_is_passed_as_coo_with_a_batch_coordinate() -> None:
    sp = [np.array([[0, 1, 4], [0, 2, 5]]), np.array([101, 102, 103]), np.array([5, 10])]
    got = _inputs(encode_instance({"s": sp}))
    assert set(got) == {"s.indices", "s.values", "s.shape"}
    assert got["s.indices"] == {"shape": [3, 3], "data": [0, 0, 0, 0, 1, 2, 0, 4, 5]}
    assert got["s.values"] == {"shape": [3], "data": [101, 102, 103]}
    assert got["s.shape"] == {"shape": [3], "data": [1, 5, 10]}


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (
            [np.array([[0, 1, 2]]), np.array([1.0]), np.array([5, 10])],
            "sparse indices must have shape [2, 1]",
        ),
        ([np.array([[0], [10]]), np.array([1.0]), np.array([5, 10])], "out of bounds"),
        ([np.array([[0], [0]]), np.array([1.0]), np.array([5, -1])], "positive"),
        ([np.array([[0], [0]]), np.array(["a"]), np.array([5, 10])], "numbers"),
        ({"path": "/nonexistent/x.png"}, "cannot read image"),
        ({"b64": base64.b64encode(b"GIF89a broken").decode()}, "not a readable image"),
        ({"url": "x"}, "'path'"),
        ([[1, 2], [3]], "rectangular"),
    ],
)
def test_bad_inputs_name_the_input(value: object, fragment: str) -> None:
    with pytest.raises(ClusterServingInputError) as err:
        encode_instance({"x": value})
    assert fragment in str(err.value) and "x" in str(err.value)


def test_sparse_layouts() -> None:
    # REST: one index row per value; Python API: one row per dimension.
    a = sparse_to_coo([[1, 1], [2, 3]], [1.0, 2.0], [4, 4], "s", points_first=True)
    b = sparse_to_coo([[1, 2], [1, 3]], [1.0, 2.0], [4, 4], "s", points_first=False)
    assert np.array_equal(a[0], b[0]) and a[0].tolist() == [[1, 1], [2, 3]]
    empty = sparse_to_coo([], [], [3], "s", points_first=True)
    assert empty[0].shape == (0, 1)


def test_image_detection_in_strings() -> None:
    png = _png(np.zeros((1, 1, 3), dtype=np.uint8))
    assert b64_image_bytes(base64.b64encode(png).decode()) == png
    assert b64_image_bytes("hello, world. hello, arrow.") is None
    assert b64_image_bytes(base64.b64encode(b"just some text bytes").decode()) is None


def test_decode_result() -> None:
    one = json.dumps({"outputs": {"y": {"dtype": "float32", "shape": [1, 2], "data": [1, 2]}}}).encode()
    got = decode_result(one, {"status": "200"})
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.tolist() == [1.0, 2.0]
    two = json.dumps(
        {
            "outputs": {
                "a": {"dtype": "int64", "shape": [1], "data": [3]},
                "s": {"dtype": "string", "shape": [1, 2], "data": ["x", "y"]},
            }
        }
    ).encode()
    got2 = decode_result(two, {"status": "200"})
    assert set(got2) == {"a", "s"} and got2["a"] == 3 and got2["s"].tolist() == ["x", "y"]
    err = decode_result(b'{"code":"InvalidInput","message":"bad"}', {"status": "400", "requestId": "r7"})
    assert isinstance(err, BadRequestError) and err.code == 400 and err.message == "bad"
    assert err.error_code == "InvalidInput" and err.request_id == "r7"
    assert isinstance(decode_result(b"garbage", {"status": "200"}), PredictException)
    assert wire_to_tensor({"shape": [2], "data": [1, 2]}).dtype == np.float32


def test_predictions_split_the_batch_axis() -> None:
    reply = json.dumps(
        {
            "outputs": {
                "per": {"dtype": "float32", "shape": [2, 2], "data": [1, 2, 3, 4]},
                "whole": {"dtype": "int64", "shape": [3], "data": [7, 8, 9]},
                "scalar": {"dtype": "float32", "shape": [], "data": [5]},
            }
        }
    ).encode()
    preds = json.loads(predictions_answer(processor_outputs(reply), 2))["predictions"]
    assert preds == [
        {"per": [1.0, 2.0], "whole": [7, 8, 9], "scalar": 5.0},
        {"per": [3.0, 4.0], "whole": [7, 8, 9], "scalar": 5.0},
    ]
