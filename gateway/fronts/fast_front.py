"""The gateway's listener with a lean HTTP/1.1 front (gateway/lean_http).

Two kinds of plain calls are answered by ``FastProtocol`` without aiohttp's request
machinery (about 100 us of CPU per call on the benchmark machine, most of a small
predict's gateway cost):

* queue calls (``gateway.queue_fast_path``): put/get/commit/delete/truncate/attributes/
  search on a queue service, or on an async service's input queue or ``/sink``, with the
  same checks as routes/predict.py's queue branch and the queue's own handlers
  (``queue.http.dispatch``);
* predict calls (``gateway.predict_fast_path``): a ``POST`` to the exact path of a
  synchronous service, through the same dataplane (gateway/core/dataplane.py) as the aiohttp
  predict route: deadline header, token or signature, dispatch and pool errors;
* V2 inference calls (``gateway.predict_fast_path``): a ``POST`` to
  ``/v2/models/<model>/infer`` of an onnx service, JSON or binary tensors, through the same
  call as the aiohttp KServe route (gateway.fronts.v2_call), errors in V2's ``{"error"}`` shape.
  A request that asks for a compressed answer goes to aiohttp, which compresses.

Both get the missing-token 401, the ``X-Request-Id`` header, the request metrics, the
access log line and cancellation when the client leaves, like the aiohttp route.
While a body is still arriving, a request without a token, or with a wrong raw token, is
answered 401 at once (``early``), and a body not complete ``body_timeout_s`` after its
head is answered 408 (``late``); both close the connection after a lingering close.
Everything else (sub-paths, discovery, admin, metrics, a WebSocket watch, a chunked or
oversized body, Content-Encoding, a percent-encoded path, HTTP/1.0, ...) is handed over
untouched to aiohttp's protocol on the same connection, so it meets the full middleware
exactly as before. The connection keeps the gateway's header deadline (slowloris),
keep-alive and body timeouts.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

from aiohttp import web

from eas_sdk._core.constants import (
    DEFAULT_CONTENT_TYPE,
    HEADER_REQUEST_ID,
    PREDICT_PATH_PREFIX,
    SINK_SUFFIX,
)
from gateway.codecs import kserve
from gateway.codecs.errors import Shape, internal, render
from gateway.codecs.v2_binary import OCTET_STREAM
from gateway.config import SERVICE_NAME_RE, ServiceConfig
from gateway.config.catalog import MODEL_PROCESSORS
from gateway.core import errors
from gateway.core.admission import BodyHold
from gateway.core.logs import ACCESS_LOGGER, log_access
from gateway.core.traffic import VERSION_HEADER
from gateway.fronts import v2_call
from gateway.fronts.server import Refused
from gateway.fronts.state import GATEWAY_KEY
from gateway.http.middleware import pick_request_id
from gateway.lean_http import FastProtocol, FastRequest, Headers, Limits, Query, protocol_factory
from gateway.queue.http import Reply, dispatch

log = logging.getLogger("gateway.request")  # the middleware's logger


def _error(exc: Exception, rid: str, shape: Shape = Shape.EAS) -> Reply:
    """An error in the route's shape (EAS, or V2's ``{"error"}``), as aiohttp's routes answer it."""
    answer = render(exc, shape, rid)
    return Reply(answer.status, answer.body, answer.content_type, {**answer.headers, HEADER_REQUEST_ID: rid})


class _Route(NamedTuple):
    svc: ServiceConfig
    queue: str | None  # the queue's name; None: a synchronous predict
    limit: int  # body bytes answered here (a larger body goes to aiohttp, which says 413)
    v2: bool = False  # a V2 inference call (/v2/models/<model>/infer)


class Front:
    """``accept`` and ``serve`` for FastProtocol, built from the gateway application."""

    def __init__(self, app: web.Application) -> None:
        self.parts = parts = app[GATEWAY_KEY]
        self.app = app
        config = parts.config
        gw = config.gateway
        self.qm = parts.queues
        self.metrics = parts.metrics
        self.access = logging.getLogger(ACCESS_LOGGER) if gw.access_log else None
        # raw path -> route: only exact paths of configured services, so everything the
        # predict route would refuse or route elsewhere goes to aiohttp.
        self.paths: dict[str, _Route] = {}
        # The listener's body limit, fixed when it starts: a predict service added later
        # takes bodies up to max_body_bytes (accept() still checks each route's own limit).
        self.max_body = gw.max_body_bytes if gw.predict_fast_path else 0
        self.refresh()
        self.plane = parts.dataplane
        # The body hold ``early`` took, for ``admit`` right after it (one request at a time:
        # the protocol asks both in one callback).
        self._arriving: tuple[FastRequest, BodyHold] | None = None
        # Services added, changed or removed at run time (gateway.manage) rebuild the table.
        parts.state.on_services_changed.append(self.refresh)

    def refresh(self) -> None:
        """(Re)build the path table from the application's current services."""
        config = self.parts.config
        gw = config.gateway
        paths: dict[str, _Route] = {}
        qm = self.qm
        backends = self.parts.backends
        for svc in config.services:
            if not SERVICE_NAME_RE.fullmatch(svc.name) or config.service(svc.name) is not svc:
                continue  # a duplicate name: the first one wins in the predict route
            if svc.processor == "queue" or svc.async_:
                if not gw.queue_fast_path:
                    continue
                limit = min(gw.max_body_bytes, max(svc.queue.max_payload_bytes, 1))
                for name in (svc.name, f"{svc.name}/{SINK_SUFFIX}"):
                    if qm is not None and name in qm.queues and qm.has(name):
                        paths[PREDICT_PATH_PREFIX + name] = _Route(svc, name, limit)
            elif gw.predict_fast_path and svc.name in backends:
                paths[PREDICT_PATH_PREFIX + svc.name] = _Route(svc, None, gw.max_body_bytes)
                if svc.processor in MODEL_PROCESSORS:
                    paths[f"/v2/models/{svc.name}/infer"] = _Route(svc, None, gw.max_body_bytes, True)
        self.paths = paths
        self.max_body = max(self.max_body, max((r.limit for r in paths.values()), default=0))

    def accept(self, method: str, path: str, headers: Headers, clen: int) -> bool:
        route = self.paths.get(path)
        if route is None or clen > route.limit:
            return False  # not ours, or a body aiohttp refuses with its 413
        if route.queue is None and method != "POST":
            return False  # aiohttp's 405
        if route.v2 and "gzip" in (headers.get("Accept-Encoding") or "").lower():
            return False  # aiohttp compresses the answer
        encoding = headers.get("Content-Encoding")
        return encoding is None or encoding.strip().lower() in ("", "identity")

    async def serve(self, req: FastRequest, query: Query) -> Reply:
        route = self.paths[req.path]
        rid = pick_request_id(req.headers.get(HEADER_REQUEST_ID))
        metrics = self.metrics
        started = time.perf_counter()
        status = 500
        metrics.inflight.inc()
        try:
            if route.v2:
                reply = await self._v2(route.svc, req, rid)
            elif route.queue is None:
                reply = await self._predict(route.svc, req, rid)
            else:
                reply = await self._queue(route.svc, route.queue, req, query, rid)
            status = reply.status
        except asyncio.CancelledError:
            status = 499  # nginx/EAS convention: client closed the request
            raise
        except Exception:  # as the middleware: logged with its traceback, a bare 500 answered
            log.exception("unhandled error in %s %s", req.method, req.path, extra={"request_id": rid})
            reply = _error(internal(), rid, Shape.V2 if route.v2 else Shape.EAS)
        finally:
            metrics.inflight.dec()
            elapsed = time.perf_counter() - started
            metrics.observe(route.svc.name, status, elapsed)
        if self.access is not None and self.access.isEnabledFor(logging.INFO):
            self._log(req, reply, elapsed, rid)
        return reply

    def early(self, req: FastRequest) -> Reply | None:
        """The body is still arriving (FastProtocol's ``early``, then ``admit``): the core is
        told (``body_arriving``), which answers the 401 due before the body (no token, a wrong
        raw token) or the 429 of a gateway receiving too much, or holds the body's length
        until it is in; ``admit`` hands that hold to the protocol."""
        route = self.paths[req.path]
        nbytes = req.content_length or 0
        try:
            hold = self.plane.body_arriving(route.svc, req.headers, nbytes, route.queue or "")
        except errors.GatewayError as exc:
            return self._refusal(route, req, exc, 0.0)
        self._arriving = (req, hold)
        return None

    def admit(self, req: FastRequest) -> Callable[[], None] | None:
        """The hold ``early`` took for this body (the protocol asks right after it); released
        by the protocol once the body is in."""
        arriving, self._arriving = self._arriving, None
        if arriving is None or arriving[0] is not req:
            return None  # not asked about first: aiohttp takes the request over
        return arriving[1].release

    def late(self, req: FastRequest) -> Reply:
        """The 408 for a body not complete within body_timeout_s (FastProtocol's ``late``)."""
        timeout = self.parts.config.gateway.body_timeout_s
        exc = errors.RequestTimeout(f"request body not received within {timeout:g} s", close=True)
        return self._refusal(self.paths[req.path], req, exc, timeout)

    def _refusal(self, route: _Route, req: FastRequest, exc: errors.GatewayError, elapsed: float) -> Reply:
        """An error answered by the protocol itself: counted and logged like ``serve``'s."""
        rid = pick_request_id(req.headers.get(HEADER_REQUEST_ID))
        reply = _error(exc, rid, Shape.V2 if route.v2 else Shape.EAS)
        self.metrics.observe(route.svc.name, exc.status, elapsed)
        if self.access is not None and self.access.isEnabledFor(logging.INFO):
            self._log(req, reply, elapsed, rid)
        return reply

    async def _predict(self, svc: ServiceConfig, req: FastRequest, rid: str) -> Reply:
        """An EAS predict to the service's own path (the body is in): one call into the core."""
        try:
            wresp = await self.plane.predict_call(
                svc, req.headers, req.path, req.body, request_id=rid, arrived=time.monotonic()
            )
        except errors.GatewayError as exc:
            return _error(exc, rid)
        ctype = wresp.content_type or DEFAULT_CONTENT_TYPE
        extra = wresp.headers  # a backend's own answer headers (Server-Timing)
        headers = {**extra, HEADER_REQUEST_ID: rid} if extra else {HEADER_REQUEST_ID: rid}
        return Reply(int(wresp.status), wresp.body, ctype, headers)

    async def _v2(self, svc: ServiceConfig, req: FastRequest, rid: str) -> Reply:
        """The KServe route's V2 inference for a model whose path names no version: its
        traffic split or ``X-Model-Version`` picks one (the body is in)."""
        extra: dict[str, str] = {}
        try:
            out, header_length = await v2_call.infer(
                self.plane, svc, None, svc.version_names[-1], self.parts.backends[svc.name].metadata,
                req.headers, req.path, req.body, request_id=rid, arrived=time.monotonic(),
                answer_headers=extra,
            )  # fmt: skip
        except v2_call.ERRORS as exc:
            return _error(exc, rid, Shape.V2)
        extra[HEADER_REQUEST_ID] = rid
        if header_length is None:
            return Reply(200, out, kserve.JSON_TYPE, extra)
        extra[kserve.BINARY_HEADER] = str(header_length)
        return Reply(200, out, OCTET_STREAM, extra)

    async def _queue(self, svc: ServiceConfig, name: str, req: FastRequest, query: Query, rid: str) -> Reply:
        try:
            await self.plane.queue_call(svc, name, req.headers, req.path, req.body, method=req.method)
        except errors.GatewayError as exc:
            return _error(exc, rid)
        qm = self.qm
        assert qm is not None  # a queue route exists only with a queue manager
        q = qm.queues.get(name)
        if q is None:
            if not qm.has(name):
                return _error(errors.ServiceNotFound(f"queue {name!r} not found"), rid)
            reply = await qm.forward(name, req, query)  # served by another gateway on the same Redis
        else:
            reply = await dispatch(qm, q, req, query)
        headers: Mapping[str, str] = {HEADER_REQUEST_ID: rid}
        if reply.headers:
            headers = {**reply.headers, HEADER_REQUEST_ID: rid}
        return Reply(reply.status, reply.body, reply.content_type, headers)

    def _log(self, req: FastRequest, reply: Reply, elapsed: float, rid: str) -> None:
        """GatewayAccessLogger's line and fields."""
        assert self.access is not None
        log_access(
            self.access, req.remote or "-", req.method, req.path, reply.status, len(reply.body),
            elapsed * 1000.0, rid, reply.headers.get(VERSION_HEADER) if reply.headers else None,
        )  # fmt: skip


class FastSite(web.BaseSite):
    """A listener whose connections start on FastProtocol (see the module docstring).

    A ``BaseSite`` as aiohttp's own sites are: ``start`` registers it with the runner and
    fills in the listening server, which ``stop`` and ``runner.addresses`` use; everything
    else it needs it keeps itself."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        conns: set[FastProtocol],
        backlog: int = 128,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, backlog=backlog, ssl_context=ssl_context)
        self.front_runner = runner
        self.host, self.port, self.backlog = host, port, backlog
        self.conns = conns

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()  # registers the site with the runner
        server = self.front_runner.server
        app = self.front_runner.app
        assert server is not None
        front = Front(app)
        # cancel_on_lost: as aiohttp's handler_cancellation=True (server.py)
        limits = Limits.of(app[GATEWAY_KEY].config.gateway, front.max_body, cancel_on_lost=True)
        factory = protocol_factory(front, server, self.conns, limits)
        admission = front.plane.admission  # counts the open connections (GatewayRunner.server)

        def admitted() -> asyncio.Protocol:
            return factory() if admission.admit_connection() else Refused()

        loop = asyncio.get_running_loop()
        # BaseSite's contract with its subclasses: the server it closes on stop().
        self._server = await loop.create_server(
            admitted, self.host, self.port, backlog=self.backlog, reuse_address=True, ssl=self._ssl_context
        )
