"""Paddle Serving's HTTP forms: parsing both request forms and answering in each."""

from __future__ import annotations

import json

import pytest

from gateway.codecs import paddle
from gateway.codecs.errors import paddle_shape, render
from gateway.core import errors
from gateway.core.json_answer import processor_outputs

REPLY = json.dumps(
    {
        "outputs": {
            "price": {"dtype": "float32", "shape": [1, 1], "data": [18.901151657104492]},
            "label": {"dtype": "string", "shape": [1], "data": ["cheap"]},
        }
    }
).encode()


def test_feed_instances_are_stacked_into_a_batch() -> None:
    body = b'{"feed": [{"x": [1, 2]}, {"x": [3, 4]}], "fetch": ["price"]}'
    req = paddle.parse(body)
    assert req.form == paddle.FEED
    assert json.loads(req.json_form()) == {"inputs": {"x": [[1, 2], [3, 4]]}, "outputs": ["price"]}


def test_a_feed_mapping_is_already_a_batch() -> None:
    req = paddle.parse(b'{"feed": {"x": [[1, 2]]}}')
    assert json.loads(req.json_form()) == {"inputs": {"x": [[1, 2]]}, "outputs": []}


def test_feed_answer_is_result_by_fetch_name() -> None:
    req = paddle.parse(b'{"feed": [{"x": [0.1]}], "fetch": ["price"]}')
    assert json.loads(paddle.answer(req, processor_outputs(REPLY))) == {
        "result": {"price": [[pytest.approx(18.901151657104492)]], "label": ["cheap"]}
    }


def test_key_value_values_are_parsed_as_one_instance_each() -> None:
    body = json.dumps(
        {
            "key": ["x", "text", "m"],
            "value": ["0.0137, -0.1136, 0.2553", "a great product", "[[1, 2], [3, 4]]"],
        }
    ).encode()
    req = paddle.parse(body)
    assert req.form == paddle.KEY_VALUE
    assert req.inputs == {
        "x": [[0.0137, -0.1136, 0.2553]],
        "text": ["a great product"],
        "m": [[[1, 2], [3, 4]]],
    }


def test_key_value_answer_is_text() -> None:
    req = paddle.parse(b'{"key": ["x"], "value": ["1"]}')
    doc = json.loads(paddle.answer(req, processor_outputs(REPLY)))
    assert doc["err_no"] == 0 and doc["err_msg"] == ""
    assert doc["key"] == ["price", "label"]
    assert doc["value"][1] == "cheap" and float(doc["value"][0]) == pytest.approx(18.901151)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "expected"),
        (b'{"feed": []}', "non-empty list"),
        (b'{"feed": [{"x": 1}, {"y": 2}]}', "feed[1] names"),
        (b'{"feed": [{"x": 1}], "fetch": "price"}', "'fetch' must be a list"),
        (b'{"key": ["x"], "value": []}', "same length"),
        (b'{"key": ["x"], "value": [1]}', "must hold strings"),
        (b'{"key": ["x"], "value": ["[1, 2"]}', "not a JSON array"),
    ],
)
def test_malformed_bodies_are_refused(body: bytes, needle: str) -> None:
    with pytest.raises(paddle.PaddleRequestError, match=needle.replace("[", r"\[")):
        paddle.parse(body)


def test_errors_carry_the_status_in_each_form() -> None:
    feed = render(errors.ServiceNotFound("nope"), paddle_shape(paddle.FEED))
    assert json.loads(feed.body) == {"err_no": 404, "err_msg": "nope"}
    kv = render(paddle.PaddleRequestError("bad"), paddle_shape(paddle.KEY_VALUE))
    assert (kv.status, json.loads(kv.body)) == (
        400,
        {"err_no": 400, "err_msg": "bad", "key": [], "value": []},
    )
    assert paddle.form_of(b'{"key": ["x"], "value": ["1"]}') == paddle.KEY_VALUE
    assert paddle.form_of(b'{"feed": [{"key": 1}]}') == paddle.FEED
