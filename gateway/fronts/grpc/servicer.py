"""``inference.GRPCInferenceService`` over the gateway's dataplane.

Each call only translates: the model (and version) is found by the dataplane
(``find_model``), an inference is one call into the core (``DataPlane.tensors_call``: the
``authorization`` metadata, a plain token or ``Bearer <token>``, checked; the call's gRPC
deadline as its budget; the tensors on the worker's TF protobuf path, as an EAS
``TFRequest``), a metadata call is checked by ``DataPlane.authorize``, and every failure
is the ``GatewayError`` it means (gateway/codecs/errors.py, the status table every front
reads) answered with the gRPC code of its status (gateway/fronts/grpc/status.py).
Metadata, configuration, statistics and the repository index are the V2 REST answers
(gateway/codecs/kserve.py) in their protobuf form.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
import numpy as np
from aiohttp import web
from google.protobuf import json_format

from gateway import __version__
from gateway._proto import grpc_service_pb2 as pb
from gateway._proto import grpc_service_pb2_grpc as pb_grpc
from gateway.backends.pipelines.timings import timings_asked
from gateway.codecs import kserve, v2_grpc
from gateway.codecs.errors import gateway_error, internal
from gateway.codecs.v2_tensors import DATATYPES
from gateway.config import ServiceConfig
from gateway.config.versions import version_key
from gateway.core import errors
from gateway.core.calls import infer_call_headers
from gateway.core.logs import ACCESS_LOGGER, log_access
from gateway.core.metadata import ModelMetadata
from gateway.core.traffic import VERSION_HEADER
from gateway.fronts.grpc.status import grpc_code, trailers
from gateway.fronts.model_kinds import agreed, check_served, group_models, is_model, not_served
from gateway.fronts.routes.repository import authorize_model_control
from gateway.fronts.state import GATEWAY_KEY, all_ready, not_ready_reason, service_ready
from gateway.http.middleware import new_request_id

log = logging.getLogger("gateway.grpc")

SERVER_NAME = "easkit-gateway"
SERVICE_PATH = "/inference.GRPCInferenceService"
# Tensors with more elements than this that are read or written element by element (BYTES,
# typed contents) are handled off the event loop; numeric raw tensors are views either way.
_LARGE = 1 << 16
Request = TypeVar("Request")
Response = TypeVar("Response")
Context = grpc.aio.ServicerContext


def _gateway_error(exc: Exception) -> errors.GatewayError:
    """The error a failure means, as over HTTP; a defect is logged and answered INTERNAL."""
    err = gateway_error(exc)
    if err is None:
        log.error("gRPC call failed", exc_info=exc)
        return internal()
    return err


def _rpc(
    fn: Callable[[Any, Request, Context, str], Awaitable[Response]],
) -> Callable[[Any, Request, Context], Awaitable[Response]]:
    """A unary call whose failures are answered with their gRPC code, message and request id."""

    path = f"{SERVICE_PATH}/{fn.__name__}"

    @functools.wraps(fn)
    async def wrapped(self: Any, request: Request, context: Context) -> Response:
        rid = new_request_id()
        started = time.perf_counter()
        try:
            resp = await fn(self, request, context, rid)
        except Exception as exc:  # every failure gets a status; abort() itself raises past this
            err = _gateway_error(exc)
        else:
            self.access(context, path, 200, resp, started, rid)
            return resp
        self.access(context, path, err.status, None, started, rid)
        await context.abort(grpc_code(err.status), err.message, trailers(err, rid))
        raise AssertionError("unreachable: abort() raises")  # pragma: no cover

    return wrapped


def remote(peer: str) -> str:
    """``ipv4:127.0.0.1:5000`` / ``ipv6:[::1]:5000`` -> the address alone."""
    address = peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]") or "-"


def auth_headers(context: Context) -> dict[str, str]:
    """The call's credentials as the dataplane reads them (gRPC metadata keys are lowercase)."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):
            return {"Authorization": value}
    return {}


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The service's calls, answered from the application's backends, config and dataplane."""

    def __init__(self, app: web.Application) -> None:
        self.parts = parts = app[GATEWAY_KEY]
        self.app = app
        self.config = parts.config
        self.plane = parts.dataplane
        self.backends = parts.backends
        self.metrics = parts.metrics
        # Disabled unless access logs are on (gateway.access_log), as for HTTP calls.
        self.access_log = logging.getLogger(ACCESS_LOGGER) if self.config.gateway.access_log else None

    def access(self, context: Context, path: str, status: int, resp: Any, started: float, rid: str) -> None:
        """The call's access line, as an HTTP call's: the peer's address, ``GRPC``, the method's
        path, the status it means, the answer's size (never metadata: it holds the token), and
        for an inference of a service with versions the version that served it."""
        if self.access_log is not None and self.access_log.isEnabledFor(logging.INFO):
            size = resp.ByteSize() if resp is not None else 0
            ms = (time.perf_counter() - started) * 1000.0
            version = self._served(resp) if isinstance(resp, pb.ModelInferResponse) else None
            log_access(self.access_log, remote(context.peer()), "GRPC", path, status, size, ms, rid, version)

    def _served(self, resp: pb.ModelInferResponse) -> str | None:
        """The version an inference answer names, when its service has versions (as an HTTP
        answer names it in X-Model-Version only then)."""
        svc = self.plane.services.get(resp.model_name)
        return resp.model_version if svc is not None and svc.versions else None

    # ------------------------------------------------------------------ lookups
    def _models(self) -> list[ServiceConfig]:
        return [s for s in self.config.services if is_model(s, self.backends)]

    def _model(self, name: str, version: str) -> tuple[ServiceConfig, ServiceConfig, str]:
        """(the model as clients name it, the service whose workers serve ``version``, that
        version): 400 for a malformed name, 404 for an unknown model or version. An empty
        version is the latest, which the service serves itself. A service group's name gives
        the member the core draws for this call (each member a model; no version of its own)."""
        if name in self.plane.groups:  # each member a model, and no version asked of the group
            group_models(self.plane.groups, self.plane.services, self.backends, name, version)
        try:
            svc = self.plane.find(name)  # 400 for a malformed name, as on every entry point
        except errors.ServiceNotFound:
            svc = None
        except errors.InvalidServiceName:
            self.metrics.unknown_service.inc()  # counted, never labelled with the client's name
            raise
        if svc is not None:
            check_served(svc, self.backends, name)  # user code that declares no tensors: what to add
            if not is_model(svc, self.backends):
                raise errors.ServiceNotFound(not_served(svc, name))  # a kind with no V2 form
        if svc is None:
            self.metrics.unknown_service.inc()
            raise errors.ServiceNotFound(f"model {name[:64]!r} not found")
        latest = svc.version_names[-1]
        if version in ("", latest):
            return svc, svc, latest
        runs = (
            self.plane.services.get(version_key(svc.name, version)) if version in svc.version_names else None
        )
        if runs is None or runs.name not in self.backends:
            raise errors.NotFound(f"model {name!r} has no version {version[:32]!r}")
        return svc, runs, version

    def _versions(self, svc: ServiceConfig) -> list[tuple[str, ServiceConfig]]:
        """Every version of ``svc`` that has a worker pool, ascending."""
        out = []
        for v in svc.version_names:
            runs = svc if v == svc.version_names[-1] else self.plane.services.get(version_key(svc.name, v))
            if runs is not None and runs.name in self.backends:
                out.append((v, runs))
        return out

    def _authorized(
        self, name: str, version: str, context: Context
    ) -> tuple[ServiceConfig, ServiceConfig, str]:
        svc, runs, v = self._model(name, version)
        self.plane.authorize(svc, auth_headers(context), "")
        return svc, runs, v

    def _group(self, name: str, version: str, context: Context) -> tuple[ServiceConfig, ...] | None:
        """The members of the service group ``name`` (each a model, the caller holding a token
        for each), else None."""
        members = group_models(self.plane.groups, self.plane.services, self.backends, name, version)
        if members is not None:
            headers = auth_headers(context)
            for m in members:
                self.plane.authorize(m, headers, "")
        return members

    def _metadata(self, svc: ServiceConfig) -> ModelMetadata:
        meta: ModelMetadata | None = self.backends[svc.name].metadata
        if meta is None:
            raise errors.ServiceNotReady(f"model {svc.name!r} is not ready")
        return meta

    # ------------------------------------------------------------------ health and metadata
    @_rpc
    async def ServerLive(self, request: Any, context: Context, rid: str) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @_rpc
    async def ServerReady(self, request: Any, context: Context, rid: str) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=all_ready(self.app))

    @_rpc
    async def ModelReady(self, request: Any, context: Context, rid: str) -> pb.ModelReadyResponse:
        try:
            members = self._group(request.name, request.version, context)
            if members is not None:  # ready when every member is
                return pb.ModelReadyResponse(ready=all(service_ready(self.app, m.name) for m in members))
            _, runs, _ = self._authorized(request.name, request.version, context)
        except (errors.ServiceNotFound, errors.NotFound, errors.ServiceNotReady):
            # A model (or version) not served, or unloaded, or user code whose workers have not
            # said what it declares yet: not ready, as Triton answers.
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=service_ready(self.app, runs.name))

    @_rpc
    async def ServerMetadata(self, request: Any, context: Context, rid: str) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=__version__)

    @_rpc
    async def ModelMetadata(self, request: Any, context: Context, rid: str) -> pb.ModelMetadataResponse:
        members = self._group(request.name, request.version, context)
        if members is not None:  # what every member answers, under the group's name
            answers = {m.name: self._model_metadata(request.name, m, m).SerializeToString() for m in members}
            return pb.ModelMetadataResponse.FromString(agreed(request.name, answers, "metadata"))
        svc, runs, _ = self._authorized(request.name, request.version, context)
        return self._model_metadata(svc.name, svc, runs)

    def _model_metadata(self, name: str, svc: ServiceConfig, runs: ServiceConfig) -> pb.ModelMetadataResponse:
        meta = self._metadata(runs)
        resp = pb.ModelMetadataResponse(
            name=name, versions=[v for v, _ in self._versions(svc)], platform=meta.platform
        )
        for specs, into in ((meta.inputs, resp.inputs), (meta.outputs, resp.outputs)):
            for t in specs:
                into.add(name=t.name, datatype=t.datatype, shape=t.shape)
        return resp

    @_rpc
    async def ModelConfig(self, request: Any, context: Context, rid: str) -> pb.ModelConfigResponse:
        members = self._group(request.name, request.version, context)
        if members is not None:  # what every member answers, under the group's name
            doc = agreed(
                request.name, {m.name: self._config(request.name, m, m) for m in members}, "configuration"
            )
        else:
            svc, runs, _ = self._authorized(request.name, request.version, context)
            doc = self._config(svc.name, svc, runs)
        resp = pb.ModelConfigResponse()
        json_format.ParseDict({"config": json.loads(doc)}, resp, ignore_unknown_fields=True)
        return resp

    def _config(self, name: str, svc: ServiceConfig, runs: ServiceConfig) -> bytes:
        b = svc.batching
        return kserve.triton_config(
            name, self._metadata(runs), workers=runs.workers,
            max_batch_size=b.max_batch_size, queue_delay_ms=b.max_latency_ms,
        )  # fmt: skip

    @_rpc
    async def ModelStatistics(self, request: Any, context: Context, rid: str) -> pb.ModelStatisticsResponse:
        members = self._group(request.name, request.version, context) if request.name else None
        if members is not None:  # each member's figures, under its own name
            figures = [(m.name, v, self.plane.stats[r.name]) for m in members for v, r in self._versions(m)]
        elif request.name:
            svc, runs, v = self._authorized(request.name, request.version, context)
            figures = [(svc.name, v, self.plane.stats[runs.name])]
            if not request.version:  # every version of the model, as over REST
                figures = [(svc.name, v, self.plane.stats[r.name]) for v, r in self._versions(svc)]
        else:  # every model whose token the caller holds (or that is open), as over REST
            headers = auth_headers(context)
            models = [s for s in self._models() if self._allowed(s, headers)]
            figures = [(s.name, v, self.plane.stats[r.name]) for s in models for v, r in self._versions(s)]
        doc = kserve.triton_statistics(figures)
        resp = pb.ModelStatisticsResponse()
        json_format.ParseDict(json.loads(doc), resp, ignore_unknown_fields=True)
        return resp

    def _allowed(self, svc: ServiceConfig, headers: dict[str, str]) -> bool:
        try:
            self.plane.authorize(svc, headers, "")
        except errors.GatewayError:
            return False
        return True

    @_rpc
    async def RepositoryIndex(self, request: Any, context: Context, rid: str) -> pb.RepositoryIndexResponse:
        resp = pb.RepositoryIndexResponse()
        for svc in self._models():
            for v, runs in self._versions(svc):
                ok = service_ready(self.app, runs.name)
                if request.ready and not ok:
                    continue
                entry = resp.models.add(name=svc.name, version=v, state="READY" if ok else "UNAVAILABLE")
                if not ok:
                    entry.reason = not_ready_reason(self.app, runs.name) or "no ready worker"
        return resp

    @_rpc
    async def RepositoryModelLoad(
        self, request: Any, context: Context, rid: str
    ) -> pb.RepositoryModelLoadResponse:
        """Triton's model control, as over REST: the admin token, then the service manager
        starts an unloaded model or rolls a loaded one."""
        name = authorize_model_control(
            self.app, auth_headers(context).get("Authorization"), request.model_name
        )
        await self.parts.manager.load(name)
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(
        self, request: Any, context: Context, rid: str
    ) -> pb.RepositoryModelUnloadResponse:
        name = authorize_model_control(
            self.app, auth_headers(context).get("Authorization"), request.model_name
        )
        await self.parts.manager.unload(name)
        return pb.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------------ inference
    async def _infer(
        self,
        request: pb.ModelInferRequest,
        context: Context,
        rid: str,
        answer_headers: dict[str, str] | None = None,
    ) -> pb.ModelInferResponse:
        """One inference; raises GatewayError or TensorError. Counted in the gateway's metrics.
        ``answer_headers``: filled with a pipeline's Server-Timing when the call's metadata
        asks for it."""
        arrived = time.monotonic()
        started = time.perf_counter()
        svc, runs, version = self._model(request.model_name, request.model_version)
        status = 500
        call_headers: dict[str, str] = {}

        async def decode(_: bytes) -> tuple[v2_grpc.InferCall, Mapping[str, np.ndarray], Sequence[str]]:
            # The call came decoded from protobuf: its tensors are read now, once authenticated.
            if any(t.datatype == "BYTES" and math.prod(t.shape) > _LARGE for t in request.inputs):
                call = await asyncio.to_thread(v2_grpc.parse_infer, request)  # a Python loop per element
            else:
                call = v2_grpc.parse_infer(request)  # numeric tensors: views, no loop
            if request.id or call.parameters:  # for the processor: read once this decode has run
                call_headers.update(infer_call_headers(request.id, call.parameters))
            return call, call.inputs, call.outputs

        try:
            meta: ModelMetadata | None = self.backends[runs.name].metadata
            declared = None
            if meta is not None:
                declared = {t.name: DATATYPES[t.datatype] for t in meta.outputs if t.datatype in DATATYPES}
            if answer_headers is not None:
                call_headers.update(timings_asked(dict(context.invocation_metadata() or ())) or {})
            else:
                answer_headers = {}
            # A call that names no version: the dataplane picks it (the traffic split).
            pins = runs if request.model_version else None
            call, arrays = await self.plane.tensors_call(
                svc, auth_headers(context), "", None, decode, runs=pins, request_id=rid,
                arrived=arrived, deadline=context.time_remaining(), declared=declared, extra=call_headers,
                answer_headers=answer_headers,
            )  # fmt: skip
            version = answer_headers.get(VERSION_HEADER, version)  # the one that served it
            order = list(call.outputs)
            if meta is not None:
                order = order or [t.name for t in meta.outputs]
            order += [n for n in arrays if n not in order]
            limit = self.plane.max_response_bytes
            build = functools.partial(
                v2_grpc.infer_response, svc.name, request.id, arrays, order,
                typed=call.typed, version=version, limit=limit,
            )  # fmt: skip
            if sum(a.size for a in arrays.values() if call.typed or a.dtype.kind in "OSU") > _LARGE:
                resp = await asyncio.to_thread(build)  # a large answer: off the event loop
            else:
                resp = build()
            status = 200
            return resp
        except asyncio.CancelledError:  # the client went away or its deadline passed: no answer
            status = 0
            raise
        except Exception as exc:
            err = gateway_error(exc)
            status = err.status if err is not None else 500
            raise
        finally:
            if status:
                self.metrics.observe(svc.name, status, time.perf_counter() - started)

    @_rpc
    async def ModelInfer(self, request: Any, context: Context, rid: str) -> pb.ModelInferResponse:
        answer: dict[str, str] = {}
        resp = await self._infer(request, context, rid, answer)
        if answer:  # a pipeline's Server-Timing: trailing metadata, with lowercase keys
            context.set_trailing_metadata(tuple((k.lower(), v) for k, v in answer.items()))
        return resp

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Context
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """One answer per request, in order; a failed request answers its error message and
        the stream goes on."""
        async for request in request_iterator:
            rid = new_request_id()
            started = time.perf_counter()
            try:
                resp = await self._infer(request, context, rid)
            except Exception as exc:
                err = _gateway_error(exc)
                self.access(context, _STREAM_PATH, err.status, None, started, rid)
                failed = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
                yield pb.ModelStreamInferResponse(error_message=err.message, infer_response=failed)
            else:
                self.access(context, _STREAM_PATH, 200, resp, started, rid)
                yield pb.ModelStreamInferResponse(infer_response=resp)


_STREAM_PATH = f"{SERVICE_PATH}/ModelStreamInfer"

__all__ = ["SERVER_NAME", "InferenceServicer", "auth_headers"]
