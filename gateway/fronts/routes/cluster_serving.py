"""The Cluster Serving REST path: ``POST /api/cluster-serving/<service>/predict`` and ``POST /predict``.

Body ``{"instances": [{name: value, ...}, ...]}`` (see gateway.codecs.cluster_serving),
answer ``{"predictions": [...]}`` (with ``?top_n=<n>``, Cluster Serving's top-N answer:
``{"class index": probability}`` per instance, most probable first); every error is
``{"error": "..."}`` with a 4xx/5xx status, as Cluster Serving's frontend answers. The
instances become one batched request in the onnx processor's JSON form, dispatched through
the service's worker pool like a synchronous predict (an async service's workers serve it
too). Bare ``/predict`` goes to ``gateway.cluster_serving_service``, or to the only predict
service when there is one.
Auth is the service's token, as for ``/api/predict``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping

import numpy as np
from aiohttp import web

from eas_sdk._core.cluster_serving import top_of
from gateway.codecs.cluster_serving import (
    ClusterServingBatch,
    ClusterServingRequestError,
    dumps,
    parse_request,
    predictions_answer,
    split_outputs,
)
from gateway.codecs.errors import Shape, render
from gateway.config import Config, ServiceConfig
from gateway.core import errors, json_answer
from gateway.core.metadata import ModelMetadata
from gateway.core.parse_pool import parse_off_loop
from gateway.fronts.state import GATEWAY_KEY, GatewayParts
from gateway.http.body import RequestBody
from gateway.http.middleware import request_id

PATH_PREFIX = "/api/cluster-serving/"
BARE_PATH = "/predict"
JSON_TYPE = "application/json"
# Bodies larger than this are parsed (and images decoded) off the event loop, and answers
# of more elements than this encoded off it.
_PARSE_ON_LOOP_MAX = 64 << 10
_ENCODE_ON_LOOP_MAX = 16 << 10


def _error(exc: BaseException) -> web.Response:
    """An error in Cluster Serving's ``{"error"}`` shape (gateway.codecs.errors)."""
    answer = render(exc, Shape.CLUSTER_SERVING)
    headers = {**answer.headers, "Content-Type": answer.content_type}
    resp = web.Response(status=answer.status, body=answer.body, headers=headers)
    if answer.close:
        resp.force_close()
    return resp


def default_service(config: Config) -> ServiceConfig | None:
    name = config.gateway.cluster_serving_service
    if name:
        return config.service(name)
    candidates = [s for s in config.services if s.processor != "queue"]
    return candidates[0] if len(candidates) == 1 else None


async def _serve(request: web.Request, service: str | ServiceConfig) -> web.Response:
    """One call into the core (``arrays_call``): ``service``, the raw name from the path or
    the default service."""
    arrived = time.monotonic()
    app = request.app
    parts = app[GATEWAY_KEY]
    gw = parts.config.gateway
    plane = parts.dataplane

    async def decode(body: bytes) -> tuple[ClusterServingBatch, bytes]:
        # Images are decoded while parsing: anything beyond a small body runs off the event loop.
        parse = functools.partial(
            parse_request, body, max_image_pixels=gw.max_image_pixels, max_values=gw.max_json_values,
            signature=_signature(parts, service),
        )  # fmt: skip
        batch = await parse_off_loop(parse) if len(body) > _PARSE_ON_LOOP_MAX else parse()
        return batch, batch.body

    body = RequestBody(request, gw.max_body_bytes, gw.body_timeout_s, hold_limit=gw.max_body_bytes)
    extra: dict[str, str] = {}  # the backend's own answer headers (the version that served it)
    try:
        top_n, output = _top_n(request)
        batch, outputs = await plane.arrays_call(
            service, request.headers, request.rel_url.raw_path, body, decode,
            request_id=request_id(request), arrived=arrived, max_values=gw.max_json_values,
            answer_headers=extra,
        )  # fmt: skip
        if top_n is not None:
            top = _top_answer(outputs, batch.size, top_n, output)
            return web.Response(body=top, content_type=JSON_TYPE, headers=extra)
        # Its size follows the client's shapes: refused before it is built past the limit.
        answer = functools.partial(predictions_answer, outputs, batch.size, plane.max_response_bytes)
        if sum(a.size for a in outputs.values()) > _ENCODE_ON_LOOP_MAX:
            # In a thread: the encoding takes the GIL a block at a time, so the loop goes on
            # between blocks (a helper process would copy the arrays there and the text back).
            out = await asyncio.to_thread(answer)
        else:
            out = answer()
    except (ClusterServingRequestError, errors.GatewayError, json_answer.AnswerTooLarge) as exc:
        return _error(exc)
    except (ValueError, TypeError) as exc:
        return _error(errors.of_status(502, f"the service's outputs have no JSON form ({exc})"))
    return web.Response(body=out, content_type=JSON_TYPE, headers=extra)


def _signature(parts: GatewayParts, service: str | ServiceConfig) -> ModelMetadata | None:
    """The signature the workers check a call to ``service`` against, when one backend runs
    every such call (neither a service group nor a model with versions, which the data plane
    routes per call): the codec refuses what it would refuse before it is sent."""
    svc = service if isinstance(service, ServiceConfig) else parts.dataplane.services.get(service)
    if svc is None or svc.versions:
        return None
    backend = parts.backends.get(svc.name)
    return backend.metadata if backend is not None else None


def _top_n(request: web.Request) -> tuple[int | None, str | None]:
    """``?top_n=<n>[&output=<name>]``: Cluster Serving's top-N answer, asked per call."""
    raw = request.query.get("top_n")
    output = request.query.get("output")
    if raw is None:
        if output is not None:
            raise ClusterServingRequestError("output= names the probabilities of top_n; give top_n too")
        return None, None
    if not raw.isdigit() or int(raw) < 1:
        raise ClusterServingRequestError(f"top_n must be a positive integer, got {raw[:32]!r}")
    return int(raw), output


def _top_answer(outputs: Mapping[str, np.ndarray], size: int, n: int, output: str | None) -> bytes:
    """``{"predictions": [{"class index": probability, ...}, ...]}``: each instance's ``n``
    most probable classes, most probable first. A model whose outputs are not class
    probabilities for it is the caller's mistake: 400 saying why."""
    try:
        tops = [top_of(row, n, output) for row in split_outputs(outputs, size)]
    except ValueError as exc:
        raise ClusterServingRequestError(str(exc)) from None
    return dumps({"predictions": tops})


async def predict_named(request: web.Request) -> web.Response:
    return await _serve(request, request.match_info["service"])


async def predict_default(request: web.Request) -> web.Response:
    parts = request.app[GATEWAY_KEY]
    svc = default_service(parts.config)
    if svc is None or svc.name not in parts.backends:
        return _error(
            errors.NotFound(
                f"no default service: set gateway.cluster_serving_service or use {PATH_PREFIX}<name>/predict"
            )
        )
    return await _serve(request, svc)


async def _not_allowed(request: web.Request) -> web.Response:
    resp = _error(errors.MethodNotAllowed(f"method {request.method} is not allowed; use POST", allow="POST"))
    resp.headers["Allow"] = "POST"  # the shape carries no headers of its own
    return resp


def setup(app: web.Application) -> None:
    app.router.add_post(PATH_PREFIX + "{service}/predict", predict_named)
    app.router.add_route("*", PATH_PREFIX + "{service}/predict", _not_allowed)
    app.router.add_post(BARE_PATH, predict_default)
    app.router.add_route("*", BARE_PATH, _not_allowed)


__all__ = ["BARE_PATH", "PATH_PREFIX", "default_service", "setup"]
