"""``POST /<service>/prediction``: Paddle Serving's HTTP forms for every service.

An aiohttp adapter over the dataplane: the body (feed/fetch or key/value, see
gateway.codecs.paddle) becomes the onnx processor's JSON form, runs on the service's
backend like an EAS predict (a model's workers or a pipeline) with the service's token
checked, and is answered in the caller's form. Every error is ``{"err_no", "err_msg"}``
with the gateway's status for it.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping

from aiohttp import web

from gateway.backends.pipelines.timings import TIMINGS_HEADER
from gateway.codecs import paddle
from gateway.codecs.errors import paddle_shape, render
from gateway.core import errors, json_answer
from gateway.core.groups import MEMBER_HEADER
from gateway.fronts.state import GATEWAY_KEY
from gateway.http.body import RequestBody
from gateway.http.middleware import request_id

# Answers of more elements than this are encoded in a thread.
_ENCODE_ON_LOOP_MAX = 16 << 10


def _reply(status: int, body: bytes | bytearray, headers: Mapping[str, str] | None = None) -> web.Response:
    resp = web.Response(status=status, body=body, content_type="application/json")
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


class _FormBody(RequestBody):
    """The request's body, noting its Paddle form once read: the errors that follow (a wrong
    signature, a refused call) are answered in the caller's form."""

    __slots__ = ("form",)

    def __init__(self, request: web.Request, max_bytes: int, timeout_s: float) -> None:
        super().__init__(request, max_bytes, timeout_s)
        self.form = paddle.FEED  # until the body is in

    async def read(self) -> bytes:
        body = await super().read()
        self.form = paddle.form_of(body)
        return body


async def prediction(request: web.Request) -> web.Response:
    parts = request.app[GATEWAY_KEY]
    started = time.perf_counter()
    name = request.match_info["service"]
    gw = parts.config.gateway
    body = _FormBody(request, gw.max_body_bytes, gw.body_timeout_s)
    try:
        resp = await _predict(request, name, body)
    except (paddle.PaddleRequestError, errors.GatewayError, json_answer.AnswerTooLarge) as exc:
        answer = render(exc, paddle_shape(body.form))
        resp = _reply(answer.status, answer.body, answer.headers)
        if answer.close:
            resp.force_close()
    if name in parts.dataplane.groups:  # a service group: counted for the member that ran it
        name = resp.headers.get(MEMBER_HEADER, "")
    if name in parts.backends:  # a configured service, never a client's string
        parts.metrics.observe(name, resp.status, time.perf_counter() - started)
    return resp


async def _decode(body: bytes) -> tuple[paddle.PaddleRequest, bytes]:
    preq = paddle.parse(body)
    return preq, preq.json_form()


async def _predict(request: web.Request, name: str, body: _FormBody) -> web.Response:
    arrived = time.monotonic()
    app = request.app
    parts = app[GATEWAY_KEY]
    plane = parts.dataplane
    gw = parts.config.gateway
    extra = {TIMINGS_HEADER: request.headers[TIMINGS_HEADER]} if TIMINGS_HEADER in request.headers else None
    answer_headers: dict[str, str] = {}
    preq, outputs = await plane.arrays_call(
        name, request.headers, request.rel_url.raw_path, body, _decode, request_id=request_id(request),
        arrived=arrived, max_values=gw.max_json_values, extra=extra, answer_headers=answer_headers,
    )  # fmt: skip
    try:
        # Its size follows the caller's shapes: refused before it is built past the limit; a
        # large one encoded in a thread, which takes the GIL a block at a time.
        encode = functools.partial(paddle.answer, preq, outputs, plane.max_response_bytes)
        large = sum(a.size for a in outputs.values()) > _ENCODE_ON_LOOP_MAX
        answer = await asyncio.to_thread(encode) if large else encode()
    except (ValueError, TypeError) as exc:
        if isinstance(exc, json_answer.AnswerTooLarge):
            raise
        raise errors.of_status(502, f"the service's outputs have no JSON form ({exc})") from None
    return _reply(200, answer, answer_headers)


def setup(app: web.Application) -> None:
    app.router.add_post("/{service}/prediction", prediction)


__all__ = ["setup"]
