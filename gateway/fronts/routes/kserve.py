"""KServe REST endpoints: the V2 Open Inference Protocol and V1, for model services.

V2: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models``,
``/v2/models/<name>[/versions/<v>]`` (metadata), ``.../ready`` (and KServe's older
``.../status``), ``.../config``, ``.../stats``, ``POST .../infer`` and ``POST .../explain``;
``/v2/models/stats`` and ``POST /v2/repository/index``. V1: ``GET /v1/models``,
``/v1/models/<name>``, ``POST /v1/models/<name>:predict`` and ``:explain``.
A model is a model service (onnx, sklearn, xgboost, lightgbm), a pipeline, or a python
service that declares its tensors (gateway.fronts.model_kinds; the service name is the model
name); its calls run on the service's workers like an EAS predict, with the service's token
checked (plain or ``EAS`` signature over the request path). An explain call runs on the
model's explainer: the service named as its ``explainer``, else its own processor's
``explain``. Errors are ``{"error": "..."}`` with a 4xx/5xx status and the gateway's
``X-Request-Id``. See gateway.codecs.kserve.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from gateway import __version__
from gateway.backends.pipelines.timings import timings_asked
from gateway.codecs import kserve as proto
from gateway.codecs import kserve_v1
from gateway.codecs.errors import Shape, render
from gateway.codecs.v2_binary import OCTET_STREAM
from gateway.config import SERVICE_NAME_RE, ServiceConfig
from gateway.config.versions import version_key
from gateway.core import errors, json_answer
from gateway.core.calls import EXPLAIN, VERB_HEADER
from gateway.core.groups import MEMBER_HEADER
from gateway.core.metadata import ModelMetadata
from gateway.fronts import v2_call
from gateway.fronts.model_kinds import agreed, as_it_came, check_served, group_models, is_model, not_served
from gateway.fronts.state import GATEWAY_KEY, all_ready, not_ready_reason, service_ready
from gateway.http.body import RequestBody, read_body
from gateway.http.middleware import request_id

# The V2 protocol extensions served, by the names Triton gives them.
EXTENSIONS = ("binary_tensor_data", "classification", "model_configuration", "model_repository", "statistics")
_COMPRESS_MIN = 1024  # smaller answers are not worth compressing


# V1 answers of more elements than this are encoded in a thread.
_ENCODE_ON_LOOP_MAX = 16 << 10


def _json(status: int, body: bytes | bytearray) -> web.Response:
    return web.Response(status=status, body=body, content_type=proto.JSON_TYPE)


def _error(exc: BaseException) -> web.Response:
    """An error in V2's ``{"error"}`` shape (the middleware adds the request id)."""
    answer = render(exc, Shape.V2)
    resp = web.Response(status=answer.status, body=answer.body, content_type=proto.JSON_TYPE)
    for k, v in answer.headers.items():
        resp.headers[k] = v
    if answer.close:
        resp.force_close()
    return resp


def _models(request: web.Request) -> list[ServiceConfig]:
    parts = request.app[GATEWAY_KEY]
    pools = parts.backends
    return [s for s in parts.config.services if is_model(s, pools)]


@dataclass(frozen=True)
class _Target:
    """One version of a model: the service as configured (its name and tokens), the version,
    and the service whose worker pool serves that version (the service itself for the latest)."""

    svc: ServiceConfig
    version: str
    runs: ServiceConfig
    # The path names the version; else the dataplane picks one (the traffic split).
    pinned: bool = True

    @property
    def pins(self) -> ServiceConfig | None:
        """What the call runs on when its path decides it; None: the dataplane picks."""
        return self.runs if self.pinned else None


def _versions(request: web.Request, svc: ServiceConfig) -> list[_Target]:
    """Every version of ``svc`` that has a worker pool, ascending; the last is the latest."""
    parts = request.app[GATEWAY_KEY]
    plane, pools = parts.dataplane, parts.backends
    names = svc.version_names
    out = []
    for v in names:
        runs = svc if v == names[-1] else plane.services.get(version_key(svc.name, v))
        if runs is not None and runs.name in pools:
            out.append(_Target(svc, v, runs))
    return out


def _model(request: web.Request) -> _Target:
    """The model version a path names (``/versions/<v>``), else the model's latest version."""
    name = request.match_info["model"]
    if not SERVICE_NAME_RE.fullmatch(name):
        raise proto.KServeRequestError("invalid model name")
    version = request.match_info.get("version")
    for svc in _models(request):
        if svc.name == name:
            if version is None or version == svc.version_names[-1]:
                return _Target(svc, svc.version_names[-1], svc, pinned=version is not None)
            for target in _versions(request, svc):
                if target.version == version:
                    return target
            raise proto.KServeRequestError(f"model {name!r} has no version {version[:32]!r}", 404)
    parts = request.app[GATEWAY_KEY]
    svc = parts.config.service(name)
    if svc is not None:
        check_served(svc, parts.backends, name)  # user code that declares no tensors: what to add
        raise proto.KServeRequestError(not_served(svc, name), 404)  # a kind with no V2 form
    if _group(request) is not None:  # a call to a service group: the core draws its member
        svc = parts.dataplane.find(name)
        return _Target(svc, svc.version_names[-1], svc, pinned=False)
    raise proto.KServeRequestError(f"model {name!r} not found", 404)


def _group(request: web.Request) -> tuple[ServiceConfig, ...] | None:
    """The members of the service group the path names (each a model), else None."""
    parts = request.app[GATEWAY_KEY]
    plane, info = parts.dataplane, request.match_info
    return group_models(plane.groups, plane.services, parts.backends, info["model"], info.get("version"))


def _group_answer(request: web.Request, members: tuple[ServiceConfig, ...], what: str, answer: Any) -> bytes:
    """What every member answers under the group's name (``answer(member)``), when they agree;
    the caller holds a token for each."""
    for m in members:
        _authorize(request, m, b"")
    return agreed(request.match_info["model"], {m.name: answer(m) for m in members}, what)


def _signature(app: web.Application, t: _Target) -> ModelMetadata:
    """The model's inputs and outputs, as its workers' processor reported them. Before any
    worker has been ready there is none: 503, as KServe answers a model that is not ready."""
    meta: ModelMetadata | None = app[GATEWAY_KEY].backends[t.runs.name].metadata
    if meta is None:
        reason = not_ready_reason(app, t.runs.name)
        raise errors.ServiceNotReady(f"model {t.svc.name!r} is not ready" + (f": {reason}" if reason else ""))
    return meta


def _authorize(request: web.Request, svc: ServiceConfig, body: bytes | None) -> None:
    request.app[GATEWAY_KEY].dataplane.authorize(svc, request.headers, request.rel_url.raw_path, body)


def _handler(fn: Any) -> Any:
    """Map protocol and gateway errors onto ``{"error"}`` bodies."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request)
        except v2_call.ERRORS as exc:
            return _error(exc)

    return wrapped


# ----------------------------------------------------------------------------- health


async def server_metadata(request: web.Request) -> web.Response:
    return _json(
        200, proto.dumps({"name": "easkit-gateway", "version": __version__, "extensions": list(EXTENSIONS)})
    )


async def root(request: web.Request) -> web.Response:
    """KServe's V1 liveness at the server's root."""
    return _json(200, proto.dumps({"status": "alive"}))


async def live(request: web.Request) -> web.Response:
    return _json(200, proto.dumps({"live": True}))


async def ready(request: web.Request) -> web.Response:
    """Ready when every service is, and every version of every model."""
    targets = (t for s in _models(request) for t in _versions(request, s))
    ok = all_ready(request.app) and all(service_ready(request.app, t.runs.name) for t in targets)
    return _json(200 if ok else 503, proto.dumps({"ready": ok}))


async def list_models(request: web.Request) -> web.Response:
    return _json(200, proto.dumps({"models": [s.name for s in _models(request)]}))


async def model_ready(request: web.Request) -> web.Response:
    members = _group(request)
    if members is not None:  # ready when every member is
        for m in members:
            _authorize(request, m, b"")
        ok = all(service_ready(request.app, m.name) for m in members)
        return _json(200 if ok else 503, proto.dumps({"name": request.match_info["model"], "ready": ok}))
    t = _model(request)
    _authorize(request, t.svc, b"")
    ok = service_ready(request.app, t.runs.name)
    return _json(200 if ok else 503, proto.dumps({"name": t.svc.name, "ready": ok}))


async def model_metadata(request: web.Request) -> web.Response:
    members = _group(request)
    if members is not None:
        name = request.match_info["model"]

        def metadata(m: ServiceConfig) -> bytes:
            return proto.v2_metadata(name, _signature(request.app, _latest(m)), m.version_names)

        return _json(200, _group_answer(request, members, "metadata", metadata))
    t = _model(request)
    _authorize(request, t.svc, b"")
    return _json(200, proto.v2_metadata(t.svc.name, _signature(request.app, t), t.svc.version_names))


async def model_config(request: web.Request) -> web.Response:
    members = _group(request)
    if members is not None:
        name = request.match_info["model"]
        body = _group_answer(request, members, "configuration", lambda m: _config(request, name, _latest(m)))
        return _json(200, body)
    t = _model(request)
    _authorize(request, t.svc, b"")
    return _json(200, _config(request, t.svc.name, t))


def _config(request: web.Request, name: str, t: _Target) -> bytes:
    svc = t.svc
    b = svc.batching
    return proto.triton_config(
        name,
        _signature(request.app, t),
        workers=svc.workers,
        max_batch_size=b.max_batch_size,
        queue_delay_ms=b.max_latency_ms,
        all_versions=len(svc.version_names) > 1,
    )


def _latest(svc: ServiceConfig) -> _Target:
    return _Target(svc, svc.version_names[-1], svc)


def _allowed(request: web.Request, svc: ServiceConfig) -> bool:
    try:
        _authorize(request, svc, b"")
    except errors.GatewayError:
        return False
    return True


async def model_stats(request: web.Request) -> web.Response:
    plane = request.app[GATEWAY_KEY].dataplane
    members = _group(request) if "model" in request.match_info else None
    if members is not None:  # each member's figures, under its own name
        for m in members:
            _authorize(request, m, b"")
        targets = [v for m in members for v in _versions(request, m)]
    elif "version" in request.match_info:
        t = _model(request)
        _authorize(request, t.svc, b"")
        targets = [t]
    elif "model" in request.match_info:  # every version of the model
        t = _model(request)
        _authorize(request, t.svc, b"")
        targets = _versions(request, t.svc)
    else:  # every model whose token the caller holds (or that is open)
        targets = [v for s in _models(request) if _allowed(request, s) for v in _versions(request, s)]
    figures = [(t.svc.name, t.version, plane.stats[t.runs.name]) for t in targets]
    return _json(200, proto.triton_statistics(figures))


async def repository_index(request: web.Request) -> web.Response:
    """Triton's model repository index: every model with its state. ``{"ready": true}`` in the
    body lists only the ready ones."""
    ready_only = False
    if request.can_read_body:
        gw = request.app[GATEWAY_KEY].config.gateway
        doc = await _parse(
            await read_body(request, min(gw.max_body_bytes, 1 << 16), gw.body_timeout_s), proto.loads
        )
        ready_only = isinstance(doc, dict) and doc.get("ready") is True
    out = []
    for t in (v for s in _models(request) for v in _versions(request, s)):
        ok = service_ready(request.app, t.runs.name)
        if ready_only and not ok:
            continue
        entry = {"name": t.svc.name, "version": t.version, "state": "READY" if ok else "UNAVAILABLE"}
        if not ok:
            entry["reason"] = "no ready worker"
        out.append(entry)
    return _json(200, proto.dumps(out))


async def v1_model(request: web.Request) -> web.Response:
    if _group(request) is not None:  # as V2's ready: ready when every member is
        return await model_ready(request)
    svc = _model(request).svc
    _authorize(request, svc, b"")
    return _json(200, proto.dumps({"name": svc.name, "ready": service_ready(request.app, svc.name)}))


# ----------------------------------------------------------------------------- inference


def _body(request: web.Request) -> RequestBody:
    gw = request.app[GATEWAY_KEY].config.gateway
    # Triton's client compresses request bodies when asked to (gzip or deflate).
    return RequestBody(request, gw.max_body_bytes, gw.body_timeout_s, decompress=True)


def _answer(
    request: web.Request,
    body: bytes | bytearray,
    header_length: int | None = None,
    extra: dict[str, str] | None = None,
) -> web.Response:
    """An inference answer, compressed when the client accepts it and it is worth it.
    ``header_length``: binary tensors follow a JSON header of that many bytes; ``extra``:
    the backend's own answer headers (a pipeline's Server-Timing)."""
    if header_length is None:
        resp = _json(200, body)
    else:
        resp = web.Response(status=200, body=body, content_type=OCTET_STREAM)
        resp.headers[proto.BINARY_HEADER] = str(header_length)
    for k, v in (extra or {}).items():
        resp.headers[k] = v
    if len(body) >= _COMPRESS_MIN and "gzip" in request.headers.get("Accept-Encoding", "").lower():
        resp.enable_compression(web.ContentCoding.gzip)
    return resp


async def _parse(body: bytes, parse: Any, *args: Any) -> Any:
    if len(body) > v2_call.LARGE_BODY:
        return await asyncio.to_thread(parse, body, *args)
    return parse(body, *args)


def _observed(fn: Any) -> Any:
    """Count inference calls in the gateway's per-service metrics."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        parts = request.app[GATEWAY_KEY]
        started = time.perf_counter()
        resp = await fn(request)
        svc_name = request.match_info.get("model", "")
        if svc_name in parts.dataplane.groups:  # counted for the member that ran it, if one did
            svc_name = resp.headers.get(MEMBER_HEADER, "")
        if svc_name in parts.backends:  # a configured service, never a client's string
            parts.metrics.observe(svc_name, resp.status, time.perf_counter() - started)
        elif svc_name and svc_name not in parts.dataplane.services and resp.status in (400, 404):
            parts.metrics.unknown_service.inc()  # a name nothing serves: counted, never labelled
        return resp

    return wrapped


async def v2_infer(request: web.Request) -> web.Response:
    """JSON and binary tensors alike run on the worker's TF protobuf path (gateway.fronts.v2_call)."""
    parts = request.app[GATEWAY_KEY]
    arrived = time.monotonic()
    target = _model(request)
    extra: dict[str, str] = {}
    out, header_length = await v2_call.infer(
        parts.dataplane,
        target.svc,
        target.pins,
        target.version,
        parts.backends[target.runs.name].metadata,
        request.headers,
        request.rel_url.raw_path,
        _body(request),
        request_id=request_id(request),
        arrived=arrived,
        extra=timings_asked(request.headers),
        answer_headers=extra,
    )
    return _answer(request, out, header_length, extra)


def _explainer(request: web.Request, t: _Target) -> tuple[_Target, dict[str, str]]:
    """What explains the model's calls, and the headers that ask it to: the service named as
    the model's ``explainer``, else the model's own processor when it explains (its
    ``explain`` method). Neither: 404 naming what is missing."""
    parts = request.app[GATEWAY_KEY]
    name = t.svc.explainer
    if name is not None:
        runs = parts.dataplane.services.get(name)
        if runs is None or name not in parts.backends:
            raise errors.NotFound(f"model {t.svc.name!r}: its explainer {name!r} is not a service here")
        return _Target(t.svc, runs.version_names[-1], runs), {}
    if not _signature(request.app, t).explains:
        raise errors.NotFound(
            f"model {t.svc.name!r} has no explainer: give its processor an explain(inputs) method, "
            "or name an explainer service (explainer: <service>)"
        )
    return t, {VERB_HEADER: EXPLAIN}


def _asks(request: web.Request, verb: dict[str, str]) -> dict[str, str] | None:
    """The headers the backend reads: a pipeline's timings when the caller asks, the verb."""
    timings = timings_asked(request.headers)
    return {**timings, **verb} if timings else verb or None


async def v2_explain(request: web.Request) -> web.Response:
    """KServe's explain: the model's call, answered by its explainer in the infer answer's form."""
    parts = request.app[GATEWAY_KEY]
    arrived = time.monotonic()
    model = _model(request)
    target, verb = _explainer(request, model)
    extra: dict[str, str] = {}
    out, header_length = await v2_call.infer(
        parts.dataplane, model.svc, target.pins, model.version, parts.backends[target.runs.name].metadata,
        request.headers, request.rel_url.raw_path, _body(request), request_id=request_id(request),
        arrived=arrived, extra=_asks(request, verb), answer_headers=extra,
    )  # fmt: skip
    return _answer(request, out, header_length, extra)


async def v1_predict(request: web.Request) -> web.Response:
    return await _v1_call(request, explain=False)


async def v1_explain(request: web.Request) -> web.Response:
    """KServe V1's ``:explain``: the instances, answered by the explainer as a predict is."""
    return await _v1_call(request, explain=True)


async def _v1_call(request: web.Request, *, explain: bool) -> web.Response:
    arrived = time.monotonic()
    model = _model(request)  # V1 has no versions: the latest
    target, verb = _explainer(request, model) if explain else (model, {})
    app = request.app
    parts = app[GATEWAY_KEY]
    plane = parts.dataplane
    if target.runs is model.svc and as_it_came(parts.backends[model.svc.name].metadata):
        return await _as_it_came(request, model, verb, arrived)

    async def decode(body: bytes) -> tuple[kserve_v1.V1Request, bytes]:
        req = await _parse(body, kserve_v1.parse_v1_predict, _signature(app, target))
        return req, req.body

    extra: dict[str, str] = {}
    req, outputs = await plane.arrays_call(
        model.svc, request.headers, request.rel_url.raw_path, _body(request), decode, runs=target.pins,
        request_id=request_id(request), arrived=arrived, max_values=parts.config.gateway.max_json_values,
        extra=_asks(request, verb), answer_headers=extra,
    )  # fmt: skip
    try:
        # Refused before it is built past the limit; a large one encoded in a thread, which
        # takes the GIL a block of elements at a time.
        encode = functools.partial(kserve_v1.v1_predictions, req, outputs, plane.max_response_bytes)
        large = sum(a.size for a in outputs.values()) > _ENCODE_ON_LOOP_MAX
        return _answer(request, await asyncio.to_thread(encode) if large else encode(), extra=extra)
    except json_answer.AnswerTooLarge as exc:
        return _error(exc)
    except (ValueError, TypeError) as exc:
        return _error(errors.of_status(502, f"the service's outputs have no JSON form ({exc})"))


async def _as_it_came(
    request: web.Request, model: _Target, verb: dict[str, str], arrived: float
) -> web.Response:
    """An existing ``kserve.Model``: the V1 body reaches it as it came (the EAS predict entry,
    with the verb), and its own answer is the call's."""
    headers = CIMultiDict(request.headers)
    headers.update(verb)
    resp = await request.app[GATEWAY_KEY].dataplane.predict_call(
        model.svc, headers, request.rel_url.raw_path, _body(request), request_id=request_id(request),
        arrived=arrived,
    )  # fmt: skip
    if resp.status != 200:
        raise errors.ProcessorFailed(int(resp.status), errors.message_of(bytes(resp.body)))
    if resp.content_type == proto.JSON_TYPE:
        return _answer(request, resp.body, extra=resp.headers)
    answer = web.Response(body=resp.body, content_type=resp.content_type)
    answer.headers.update(resp.headers or {})  # the member (or version) that answered
    return answer


def setup(app: web.Application) -> None:
    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    r = app.router
    r.add_get("/", _handler(root))
    r.add_get("/v2", _handler(server_metadata))
    r.add_get("/v2/health/live", _handler(live))
    r.add_get("/v2/health/ready", _handler(ready))
    r.add_get("/v2/models", _handler(list_models))
    r.add_get("/v2/models/stats", _handler(model_stats))
    r.add_post("/v2/repository/index", _handler(repository_index))
    for base in (model, versioned):
        r.add_get(base, _handler(model_metadata))
        r.add_get(base + "/ready", _handler(model_ready))
        r.add_get(base + "/config", _handler(model_config))
        r.add_get(base + "/stats", _handler(model_stats))
        r.add_post(base + "/infer", _observed(_handler(v2_infer)))
        r.add_post(base + "/explain", _observed(_handler(v2_explain)))
        r.add_get(base + "/status", _handler(model_ready))  # KServe's older name for ready
    r.add_get("/v1/models", _handler(list_models))
    r.add_get("/v1/models/{model:[^/:]+}", _handler(v1_model))
    r.add_post("/v1/models/{model:[^/:]+}:predict", _observed(_handler(v1_predict)))
    r.add_post("/v1/models/{model:[^/:]+}:explain", _observed(_handler(v1_explain)))


__all__ = ["setup"]
