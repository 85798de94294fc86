"""The gateway's listener with the queue's lean HTTP/1.1 front (gateway/lean_http.py).

Plain queue calls (put/get/commit/delete/truncate/attributes/search on a queue
service, or on an async service's input queue or ``/sink``) are answered by
``FastProtocol`` with the same checks as routes/predict.py's queue branch: the
missing-token 401, the token/signature check, the queue's own handlers
(``queue.http.dispatch``), the ``X-Request-Id`` header, the request metrics and
the access log line. Everything else (predict, discovery, admin, metrics, a
WebSocket watch, a chunked or oversized body, Content-Encoding, a percent-encoded
path, HTTP/1.0, ...) is handed over untouched to aiohttp's protocol on the same
connection, so it meets the full middleware exactly as before. The connection
keeps the gateway's header deadline (slowloris), keep-alive and body timeouts.

Switch: ``gateway.queue_fast_path`` (default on); off serves everything with aiohttp.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping

from aiohttp import web

from eas_sdk._core.constants import HEADER_AUTHORIZATION, HEADER_REQUEST_ID, PREDICT_PATH_PREFIX, SINK_SUFFIX
from gateway import errors
from gateway.app import CONFIG_KEY, METRICS_KEY, QUEUES_KEY
from gateway.auth import AuthStatus, verify
from gateway.config import SERVICE_NAME_RE, ServiceConfig
from gateway.lean_http import FastProtocol, FastRequest, Headers, Query
from gateway.logging import ACCESS_LOGGER
from gateway.middleware import pick_request_id
from gateway.queue.http import Reply, dispatch

_JSON = "application/json; charset=utf-8"


def _error(exc: errors.GatewayError, rid: str) -> Reply:
    """The middleware's JSON error shape (middleware.error_response)."""
    body = json.dumps({"code": exc.code, "message": exc.message, "request_id": rid}, ensure_ascii=True)
    return Reply(exc.status, body.encode(), _JSON, {**exc.headers, HEADER_REQUEST_ID: rid})


class QueueFront:
    """``accept`` and ``serve`` for FastProtocol, built from the gateway application."""

    def __init__(self, app: web.Application) -> None:
        config = app[CONFIG_KEY]
        gw = config.gateway
        self.qm = app[QUEUES_KEY]
        self.metrics = app[METRICS_KEY]
        self.access = logging.getLogger(ACCESS_LOGGER) if gw.access_log else None
        # raw path -> (service, queue name, body limit): only exact paths of configured queues,
        # so everything the predict route would refuse or route elsewhere goes to aiohttp.
        self.paths: dict[str, tuple[ServiceConfig, str, int]] = {}
        qm = self.qm
        queues = getattr(qm, "queues", None)  # a QueueManager's (a test double may have none)
        for svc in config.services:
            if not (svc.processor == "queue" or svc.async_) or not SERVICE_NAME_RE.fullmatch(svc.name):
                continue
            if config.service(svc.name) is not svc:
                continue  # a duplicate name: the first one wins in the predict route
            limit = min(gw.max_body_bytes, max(svc.queue.max_payload_bytes, 1))
            for name in (svc.name, f"{svc.name}/{SINK_SUFFIX}"):
                if isinstance(queues, dict) and name in queues and qm.has(name):
                    self.paths[PREDICT_PATH_PREFIX + name] = (svc, name, limit)
        self.max_body = max((entry[2] for entry in self.paths.values()), default=0)
        # (queue, raw token) pairs that verified (a client sends the same token on every call;
        # tokens come from the config, so a success stays one). Successes only, bounded.
        self.verified: dict[tuple[str, str], None] = {}

    def accept(self, path: str, headers: Headers, clen: int) -> bool:
        entry = self.paths.get(path)
        if entry is None or clen > entry[2]:
            return False  # not a queue, or a body aiohttp refuses with its 413
        encoding = headers.get("Content-Encoding")
        return encoding is None or encoding.strip().lower() in ("", "identity")

    async def serve(self, req: FastRequest, query: Query) -> Reply:
        svc, name, _limit = self.paths[req.path]
        rid = pick_request_id(req.headers.get(HEADER_REQUEST_ID))
        metrics = self.metrics
        started = time.perf_counter()
        status = 500
        metrics.inflight.inc()
        try:
            reply = await self._call(svc, name, req, query, rid)
            status = reply.status
        finally:
            metrics.inflight.dec()
            elapsed = time.perf_counter() - started
            metrics.observe(svc.name, status, elapsed)
        if self.access is not None and self.access.isEnabledFor(logging.INFO):
            self._log(req, reply, elapsed, rid)
        return reply

    async def _call(self, svc: ServiceConfig, name: str, req: FastRequest, query: Query, rid: str) -> Reply:
        if svc.tokens:
            if not req.headers.get(HEADER_AUTHORIZATION):
                return _error(errors.Unauthorized("invalid or missing token"), rid)
            auth = req.headers.get(HEADER_AUTHORIZATION)
            key = (name, auth)
            if key not in self.verified:
                # aiohttp's can_read_body: only a POST with a non-empty body hands its bytes to verify.
                body = req.body if req.method == "POST" and req.body else None
                result = verify(svc.tokens, req.headers, req.path, body)
                if not result.ok:
                    if result.status is AuthStatus.BAD_DIGEST:
                        return _error(errors.BadDigest("Content-MD5 does not match the body"), rid)
                    return _error(errors.Unauthorized("invalid or missing token"), rid)
                if not auth.startswith("EAS "):  # a raw token (a signature covers this call only)
                    if len(self.verified) >= 1024:
                        self.verified.clear()
                    self.verified[key] = None
        q = self.qm.queues.get(name)
        if q is None:
            return _error(errors.ServiceNotFound(f"queue {name!r} not found"), rid)
        reply = await dispatch(self.qm, q, req, query)
        headers: Mapping[str, str] = {HEADER_REQUEST_ID: rid}
        if reply.headers:
            headers = {**reply.headers, HEADER_REQUEST_ID: rid}
        return Reply(reply.status, reply.body, reply.content_type, headers)

    def _log(self, req: FastRequest, reply: Reply, elapsed: float, rid: str) -> None:
        """GatewayAccessLogger's line and fields."""
        assert self.access is not None
        remote, method, path = req.remote or "-", req.method, req.path
        status, size = reply.status, len(reply.body)
        ms = elapsed * 1000.0
        self.access.info(
            "%s %s %s %d %dB %.1fms rid=%s", remote, method, path, status, size, ms, rid,
            extra={
                "request_id": rid, "method": method, "path": path, "status": status,
                "bytes": size, "duration_ms": round(ms, 3), "remote": remote,
            },
        )  # fmt: skip


class QueueFastSite(web.TCPSite):
    """A TCPSite whose connections start on FastProtocol (see the module docstring)."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, *, conns: set[FastProtocol], backlog: int = 128
    ) -> None:
        super().__init__(runner, host, port, backlog=backlog)
        self._conns = conns

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        server = self._runner.server
        app = getattr(self._runner, "app", None)
        assert server is not None and isinstance(app, web.Application)
        front = QueueFront(app)
        gw = app[CONFIG_KEY].gateway
        conns = self._conns

        def factory() -> asyncio.Protocol:
            return FastProtocol(
                front.serve,
                server,
                conns,
                front.max_body,
                accept=front.accept,
                header_timeout=gw.header_timeout_s,
                keepalive_timeout=gw.keepalive_timeout_s,
                body_timeout=gw.body_timeout_s,
            )

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            factory, self._host, self._port, backlog=self._backlog, reuse_address=self._reuse_address
        )
