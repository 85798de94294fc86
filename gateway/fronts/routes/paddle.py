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

from aiohttp import web

from gateway.backends.pipelines.timings import TIMINGS_HEADER
from gateway.codecs import paddle
from gateway.core import errors, json_answer
from gateway.fronts.state import BACKENDS_KEY, CONFIG_KEY, DATAPLANE_KEY, METRICS_KEY
from gateway.http.body import read_body, refuse_before_body
from gateway.http.middleware import request_id

# Answers of more elements than this are encoded in a thread.
_ENCODE_ON_LOOP_MAX = 16 << 10


def _reply(status: int, body: bytes | bytearray, headers: dict[str, str] | None = None) -> web.Response:
    resp = web.Response(status=status, body=body, content_type="application/json")
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


async def prediction(request: web.Request) -> web.Response:
    started = time.perf_counter()
    name = request.match_info["service"]
    form = [paddle.FEED]  # the caller's form once the body is in: it shapes the errors
    try:
        resp = await _predict(request, name, form)
    except paddle.PaddleRequestError as exc:
        resp = _reply(exc.status, paddle.error(form[0], exc.status, str(exc)))
    except errors.GatewayError as exc:
        resp = _reply(exc.status, paddle.error(form[0], exc.status, exc.message), exc.headers)
        if exc.close:
            resp.force_close()
    if name in request.app[BACKENDS_KEY]:  # a configured service, never a client's string
        request.app[METRICS_KEY].observe(name, resp.status, time.perf_counter() - started)
    return resp


async def _predict(request: web.Request, name: str, form: list[str]) -> web.Response:
    arrived = time.monotonic()
    app = request.app
    plane = app[DATAPLANE_KEY]
    svc = plane.find_model(name)
    gw = app[CONFIG_KEY].gateway
    refuse_before_body(plane, svc, request)
    deadline = plane.caller_deadline(request.headers)
    body = await read_body(request, gw.max_body_bytes, gw.body_timeout_s)
    form[0] = paddle.form_of(body)
    plane.authenticate(svc, request.headers, request.rel_url.raw_path, body)
    timeout = plane.budget(svc, deadline, arrived)
    preq = paddle.parse(body)
    extra = {TIMINGS_HEADER: request.headers[TIMINGS_HEADER]} if TIMINGS_HEADER in request.headers else None
    answer_headers: dict[str, str] = {}
    outputs = await plane.infer_arrays(
        svc, preq.json_form(), request_id=request_id(request), timeout=timeout,
        max_values=gw.max_json_values, extra=extra, answer_headers=answer_headers,
    )  # fmt: skip
    try:
        # Its size follows the caller's shapes: refused before it is built past the limit; a
        # large one encoded in a thread, which takes the GIL a block at a time.
        encode = functools.partial(paddle.answer, preq, outputs, plane.max_response_bytes)
        large = sum(a.size for a in outputs.values()) > _ENCODE_ON_LOOP_MAX
        answer = await asyncio.to_thread(encode) if large else encode()
    except json_answer.AnswerTooLarge as exc:
        return _reply(exc.status, paddle.error(preq.form, exc.status, str(exc)))
    except (ValueError, TypeError) as exc:
        return _reply(502, paddle.error(preq.form, 502, f"the service's outputs have no JSON form ({exc})"))
    return _reply(200, answer, answer_headers)


def setup(app: web.Application) -> None:
    app.router.add_post("/{service}/prediction", prediction)


__all__ = ["setup"]
