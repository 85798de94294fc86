"""Every request type of eas_sdk.requests through both clients, answered with real protobuf."""

from __future__ import annotations

from typing import Any

import pytest

from eas_sdk import BladeRequest, StringRequest, StringResponse, TFRequest, TorchRequest

from .conftest import TOKEN
from .fake_eas import FakeEAS

pytestmark = pytest.mark.timeout(30)


async def test_string_request(server: FakeEAS, make_client: Any) -> None:
    h = make_client(server.url, "echo", token=TOKEN)
    resp = await h.predict(StringRequest('[{"fea1": 1}]'))
    assert isinstance(resp, StringResponse)
    assert resp.response_data == b'[{"fea1": 1}]'
    assert server.predicts[0].auth_ok


async def test_tf_request(server: FakeEAS, make_client: Any) -> None:
    req = TFRequest("predict_images")
    req.add_feed("images", [1, 2], TFRequest.DT_FLOAT, [1.0, 2.0])
    req.add_fetch("scores")
    h = make_client(server.url, "tf_model", token=TOKEN)
    resp = await h.predict(req)
    assert resp.get_tensor_shape("scores") == [1, 2]
    assert list(resp.get_values("scores")) == [1.0, 2.0]
    (rec,) = server.predicts
    assert rec.auth_ok and rec.body == req.to_string()


async def test_tf_request_strings_and_ints(server: FakeEAS, make_client: Any) -> None:
    req = TFRequest("serving_default")
    req.add_feed("ids", [3], TFRequest.DT_INT64, [1, 2, 3])
    req.add_feed("words", [2], TFRequest.DT_STRING, [b"a", b"bc"])
    h = make_client(server.url, "tf_model", token=TOKEN)
    resp = await h.predict(req)
    assert list(resp.get_values("ids")) == [1, 2, 3]
    assert list(resp.get_values("words")) == [b"a", b"bc"]


async def test_torch_request(server: FakeEAS, make_client: Any) -> None:
    req = TorchRequest()
    req.add_feed(0, [1, 3], TorchRequest.DT_FLOAT, [0.5, 1.5, 2.5])
    h = make_client(server.url, "torch_model", token=TOKEN)
    resp = await h.predict(req)
    assert resp.get_tensor_shape(0) == [1, 3]
    assert list(resp.get_values(0)) == [0.5, 1.5, 2.5]


async def test_blade_request(server: FakeEAS, make_client: Any) -> None:
    req = BladeRequest("sig")
    req.add_feed("in", 1, [1, 2], BladeRequest.DT_FLOAT, [1.0, 2.0])
    req.add_fetch("out", BladeRequest.DT_FLOAT)
    h = make_client(server.url, "blade_model", token=TOKEN)
    resp = await h.predict(req)
    assert resp.get_tensor_shape("out") == [1, 2]
    assert list(resp.get_values("out", BladeRequest.DT_FLOAT)) == [1.0, 2.0]


async def test_blade_tf_request(server: FakeEAS, make_client: Any) -> None:
    from eas_sdk.requests import BladeTFRequest

    req = BladeTFRequest("predict_words")
    req.add_feed("input_length", [1], BladeTFRequest.DT_INT32, [187])
    req.add_fetch("output")
    h = make_client(server.url, "blade_tf_model", token=TOKEN)
    resp = await h.predict(req)
    assert list(resp.get_values("output", BladeTFRequest.DT_INT32)) == [187]
    assert server.predicts[0].auth_ok
