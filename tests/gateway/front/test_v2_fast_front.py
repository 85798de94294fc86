"""V2 inference calls on the lean front: which ones it answers and which it hands to aiohttp."""

from __future__ import annotations

from gateway.fronts.fast_front import Front
from gateway.fronts.state import GATEWAY_KEY
from gateway.lean_http import Headers
from tests.gateway.front.fakes import live_gateway


async def test_the_lean_front_takes_plain_v2_infer_calls_of_onnx_models() -> None:
    async with live_gateway() as gw:
        front = Front(gw.app)
        plain = Headers({"content-type": "application/json"})
        assert front.accept("POST", "/v2/models/digits/infer", plain, 100)
        # aiohttp's: another method (405), a version's path, a python service (not a V2
        # model), an answer asked compressed, a compressed body, a body over the limit.
        assert not front.accept("GET", "/v2/models/digits/infer", plain, 0)
        assert not front.accept("POST", "/v2/models/digits/versions/1/infer", plain, 100)
        assert not front.accept("POST", "/v2/models/echo/infer", plain, 100)
        assert not front.accept("POST", "/v2/models/digits/infer", Headers({"accept-encoding": "gzip"}), 100)
        assert not front.accept("POST", "/v2/models/digits/infer", Headers({"content-encoding": "gzip"}), 100)
        limit = gw.app[GATEWAY_KEY].config.gateway.max_body_bytes
        assert not front.accept("POST", "/v2/models/digits/infer", plain, limit + 1)
