"""POST /api/predict/<service>[/<subpath>]: the EAS predict route (and the queue front door).

Order of checks, cheapest first, so hostile input costs nothing:
service name (400) -> existence (404) -> method (405) -> Content-Encoding (415)
-> Content-Length (413, before reading) -> missing token, or a wrong raw token while
the body is still arriving (401, before reading; ``token_refused_early``)
-> body within body_timeout_s (408) and max_body_bytes (413 while reading)
-> token / signature (401, 400 BadDigest) -> deadline -> dispatch to the pool
(450 / 503 / 504). The worker's status, content type and body pass through.

The checks after the body and the dispatch are plain functions over a header mapping
(``check_auth``, ``caller_deadline_s``, ``worker_request``, ``call_workers``), shared with
the gateway's lean front (gateway/fast_front.py), which answers plain predict calls
without aiohttp's request machinery.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from eas_sdk._core.constants import (
    DEFAULT_CONTENT_TYPE,
    HEADER_AUTHORIZATION,
    HEADER_DEADLINE_MS,
    PREDICT_PATH_PREFIX,
    SINK_SUFFIX,
)
from gateway import errors
from gateway.auth import AuthStatus, verify
from gateway.config import ServiceConfig
from gateway.middleware import request_id
from gateway.routes import lookup_service, raw_tail, split_service
from gateway.state import CONFIG_KEY, METRICS_KEY, POOLS_KEY, QUEUES_KEY, WORKER_REQUEST_KEY
from gateway.workers.ipc import WorkerRequest, WorkerResponse

log = logging.getLogger("gateway.predict")

# Below this much remaining budget a request is not worth starting (F17).
MIN_DEADLINE_MS = 10
# Request headers never handed to workers (credentials and hop-by-hop).
_DROP_HEADERS = frozenset(
    h.lower()
    for h in (
        "Authorization", "Content-MD5", "Date", "Host", "Connection", "Content-Length",
        "Transfer-Encoding", "Keep-Alive", "Cookie", "Upgrade", "Proxy-Authorization",
    )
)  # fmt: skip
_POOL_ERRORS = {
    "PoolOverloaded": lambda m: errors.TooManyPending(m),
    "NoReadyWorker": lambda m: errors.ServiceNotReady(m),
    "UpstreamTimeout": lambda m: errors.UpstreamTimeout(m),
}
_DEFAULT_POOL_MESSAGES = {
    "PoolOverloaded": "service is busy: too many pending requests",
    "NoReadyWorker": "service has no ready worker",
    "UpstreamTimeout": "the worker did not answer in time",
}


def map_pool_error(exc: BaseException) -> errors.GatewayError | None:
    # Matched by class name along the MRO so the front does not import the worker
    # package (multiprocessing, onnxruntime) just to name its exceptions.
    for cls in type(exc).__mro__:
        make = _POOL_ERRORS.get(cls.__name__)
        if make is not None:
            return make(_DEFAULT_POOL_MESSAGES[cls.__name__])
    return None


async def read_body(request: web.Request, max_bytes: int, timeout_s: float) -> bytes:
    """Read the whole body within limits; the result is cached on the request (request.read())."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise errors.UnsupportedMediaType(f"Content-Encoding {encoding[:32]!r} is not supported", close=True)
    length = request.content_length
    if length is not None and length > max_bytes:
        raise errors.PayloadTooLarge(f"request body exceeds {max_bytes} bytes", close=True)
    try:
        if request.content.is_eof():
            # Already received in full (small bodies): nothing to wait for, so no timer task.
            return await request.read()
        return await asyncio.wait_for(request.read(), timeout_s)
    except asyncio.TimeoutError:
        raise errors.RequestTimeout(f"request body not received within {timeout_s:g} s", close=True) from None
    except web.HTTPRequestEntityTooLarge:
        raise errors.PayloadTooLarge(f"request body exceeds {max_bytes} bytes", close=True) from None
    except RequestPayloadError:
        raise errors.BadRequest("malformed request body", close=True) from None


def token_refused_early(svc: ServiceConfig, headers: Mapping[str, str]) -> bool:
    """True when a request to ``svc`` (a service with tokens) fails auth whatever its body
    holds: no ``Authorization``, or a raw token that matches none of the service's tokens.
    An ``EAS`` signature covers the body's MD5, so it is only checked once the body is in."""
    auth = headers.get(HEADER_AUTHORIZATION)
    if not auth:
        return True
    if auth.startswith("EAS "):
        return False
    return not verify(svc.tokens, headers, "", None).ok


def check_auth(svc: ServiceConfig, headers: Mapping[str, str], raw_path: str, body: bytes | None) -> None:
    if not svc.tokens:
        return
    result = verify(svc.tokens, headers, raw_path, body)
    if result.ok:
        return
    if result.status is AuthStatus.BAD_DIGEST:
        raise errors.BadDigest("Content-MD5 does not match the body")
    raise errors.Unauthorized("invalid or missing token")


def caller_deadline_s(headers: Mapping[str, str]) -> float | None:
    """The caller's remaining budget (X-Eas-Deadline-Ms) in seconds, or None without one."""
    raw = headers.get(HEADER_DEADLINE_MS)
    if raw is None:
        return None
    try:
        deadline_ms = int(raw.strip())
    except ValueError:
        raise errors.BadRequest(f"{HEADER_DEADLINE_MS} must be an integer") from None
    if deadline_ms < MIN_DEADLINE_MS:
        raise errors.DeadlineExceeded("the caller's deadline has already passed")
    return deadline_ms / 1000.0


def timeout_s(svc: ServiceConfig, deadline: float | None, arrived: float) -> float:
    """The request's budget: the service's timeout, or less when the caller's deadline
    (which also paid for the upload since ``arrived``, monotonic) leaves less."""
    timeout = svc.timeout_ms / 1000.0
    if deadline is not None:
        timeout = min(timeout, deadline - (time.monotonic() - arrived))
        if timeout < MIN_DEADLINE_MS / 1000.0:
            raise errors.DeadlineExceeded("the caller's deadline passed while the body was read")
    return timeout


def worker_request(
    app: web.Application,
    svc: ServiceConfig,
    subpath: str,
    headers: Mapping[str, str],
    body: bytes,
    rid: str,
    timeout: float,
) -> WorkerRequest:
    make_request: Any = app[WORKER_REQUEST_KEY]
    wreq: WorkerRequest = make_request(
        body=body,
        subpath=subpath,
        content_type=headers.get("Content-Type", DEFAULT_CONTENT_TYPE),
        request_id=rid,
        # Plain str keys: multidict keys are istr, which strict JSON encoders (orjson) refuse.
        headers={str(k): str(v) for k, v in headers.items() if k.lower() not in _DROP_HEADERS},
        # The worker drops the request unrun once this passes (F17).
        deadline=time.monotonic() + timeout,
    )
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "dispatch %s subpath=%r bytes=%d timeout=%.3fs",
            svc.name, subpath, len(body), timeout, extra={"request_id": rid},
        )  # fmt: skip
    return wreq


async def call_workers(
    app: web.Application, svc: ServiceConfig, wreq: WorkerRequest, timeout: float
) -> WorkerResponse:
    """Dispatch to the service's pool; pool failures become the gateway's errors."""
    t0 = time.perf_counter()
    try:
        wresp: WorkerResponse = await app[POOLS_KEY][svc.name].dispatch(wreq, timeout)
    except asyncio.TimeoutError:
        raise errors.UpstreamTimeout("the worker did not answer in time") from None
    except errors.GatewayError:
        raise
    except Exception as exc:
        mapped = map_pool_error(exc)
        if mapped is None:
            raise
        raise mapped from None
    compute_us = int(getattr(wresp, "compute_us", 0))
    app[METRICS_KEY].observe_dispatch(svc.name, time.perf_counter() - t0, compute_us)
    return wresp


JSON_FORM_HEADERS = {"Content-Type": "application/json", "X-Eas-Request-Format": "json"}


async def call_json_form(
    app: web.Application, svc: ServiceConfig, body: bytes, rid: str, timeout: float
) -> tuple[int, bytes | str]:
    """A request in the onnx processor's JSON form through the service's pool (the Cluster
    Serving and KServe routes): -> (200, reply body) or (status, the processor's error
    message). Pool failures raise the gateway's errors, as for predict."""
    wreq = worker_request(app, svc, "", JSON_FORM_HEADERS, body, rid, timeout)
    wresp = await call_workers(app, svc, wreq, timeout)
    status, reply = int(wresp.status), bytes(wresp.body)
    if status == 200:
        return status, reply
    text = reply.decode("utf-8", "replace")
    try:  # the processor's JSON error -> its message
        doc = json.loads(text)
        text = str(doc.get("message", text)) if isinstance(doc, dict) else text
    except ValueError:
        pass
    return status, text


def _refused_before_body(svc: ServiceConfig, request: web.Request) -> bool:
    """No token at all; or, while the body is still arriving, a raw token that is wrong (a
    body already in costs nothing to read, and check_auth then looks at the token once)."""
    if not request.headers.get(HEADER_AUTHORIZATION):
        return True
    return not request.content.is_eof() and token_refused_early(svc, request.headers)


async def _queue(request: web.Request, svc: ServiceConfig, subpath: str) -> web.StreamResponse:
    qm = request.app[QUEUES_KEY]
    name = svc.name if not subpath else f"{svc.name}/{subpath}"
    if qm is None or subpath not in ("", SINK_SUFFIX) or not qm.has(name):
        raise errors.ServiceNotFound(f"queue {name!r} not found")
    gw = request.app[CONFIG_KEY].gateway
    if svc.tokens and _refused_before_body(svc, request):
        raise errors.Unauthorized("invalid or missing token")
    body: bytes | None = None
    if request.method == "POST" and request.can_read_body:
        limit = min(gw.max_body_bytes, max(svc.queue.max_payload_bytes, 1))
        body = await read_body(request, limit, gw.body_timeout_s)
    check_auth(svc, request.headers, request.rel_url.raw_path, body)
    resp: web.StreamResponse = await qm.handle(request, name)
    return resp


async def predict(request: web.Request) -> web.StreamResponse:
    app = request.app
    config = app[CONFIG_KEY]
    metrics = app[METRICS_KEY]
    name, subpath = split_service(raw_tail(request, PREDICT_PATH_PREFIX))
    try:
        svc = lookup_service(config, name)
    except (errors.InvalidServiceName, errors.ServiceNotFound):
        metrics.unknown_service.inc()
        raise
    started = time.perf_counter()
    status = 500
    metrics.inflight.inc()
    try:
        if svc.processor == "queue" or svc.async_:
            resp = await _queue(request, svc, subpath)
        else:
            resp = await _predict(request, svc, subpath)
        status = resp.status
        return resp
    except errors.GatewayError as exc:
        status = exc.status
        raise
    except (asyncio.CancelledError, ConnectionError):
        status = 499  # nginx/EAS convention: client closed the request
        raise
    finally:
        metrics.inflight.dec()
        metrics.observe(svc.name, status, time.perf_counter() - started)


async def _predict(request: web.Request, svc: ServiceConfig, subpath: str) -> web.StreamResponse:
    app = request.app
    gw = app[CONFIG_KEY].gateway
    if request.method != "POST":
        raise errors.MethodNotAllowed(f"method {request.method} is not allowed; use POST", allow="POST")
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in subpath):
        raise errors.BadRequest("invalid characters in the request path")
    if svc.tokens and _refused_before_body(svc, request):
        raise errors.Unauthorized("invalid or missing token")
    arrived = time.monotonic()
    deadline = caller_deadline_s(request.headers)  # checked before reading the body
    body = await read_body(request, gw.max_body_bytes, gw.body_timeout_s)
    check_auth(svc, request.headers, request.rel_url.raw_path, body)
    timeout = timeout_s(svc, deadline, arrived)
    wreq = worker_request(app, svc, subpath, request.headers, body, request_id(request), timeout)
    wresp = await call_workers(app, svc, wreq, timeout)
    return web.Response(
        status=int(wresp.status),
        body=wresp.body,
        headers={"Content-Type": wresp.content_type or DEFAULT_CONTENT_TYPE},
    )


def setup(app: web.Application) -> None:
    app.router.add_route("*", PREDICT_PATH_PREFIX + r"{tail:[\s\S]*}", predict)
