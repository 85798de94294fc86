"""The worker's direct-mode HTTP endpoint: ``POST /api/predict/<service>[/<subpath>]``
with the gateway's auth (gateway.auth.verify), for direct-mode clients, and ``GET /healthz``."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from eas_sdk._core.constants import DEFAULT_CONTENT_TYPE, HEADER_DEADLINE_MS, HEADER_REQUEST_ID
from gateway.auth import AuthStatus, verify
from gateway.config import GatewayConfig, ServiceConfig
from gateway.lean_http import LINGER_S, FastRequest, Reply
from gateway.middleware import pick_request_id
from gateway.workers.compute import ComputeQueue
from gateway.workers.ipc import WorkerRequest, WorkerResponse
from gateway.workers.processors.base import error_response

log = logging.getLogger("gateway.worker")


class DirectHTTP:
    """The worker's direct-mode predict: the gateway's auth and deadline checks, then the
    compute queue. Served by the lean protocol (gateway/lean_http.py) for plain calls and
    by aiohttp (``app``) for everything else, both through :meth:`answer`. Every reply
    carries ``X-Request-Id`` (the caller's when well-formed, else a fresh one), as the
    gateway's do."""

    def __init__(self, service: ServiceConfig, gateway: GatewayConfig, compute: ComputeQueue) -> None:
        self.service = service
        self.gateway = gateway
        self.compute = compute
        self.prefix = f"/api/predict/{service.name}"
        self.tokens = service.tokens
        # Raw tokens that verified (tokens come from the config, so a success stays one; a
        # signature covers one call only and is always checked). Successes only, bounded.
        self._verified: set[str] = set()

    def _remember(self, auth: str) -> None:
        if len(self._verified) >= 1024:
            self._verified.clear()
        self._verified.add(auth)

    async def answer(self, headers: Any, raw_path: str, tail: str, body: bytes, rid: str) -> WorkerResponse:
        service = self.service
        # Same checks and messages as the gateway's predict route.
        if self.tokens and headers.get("Authorization") not in self._verified:
            result = verify(self.tokens, headers, raw_path, body)
            if not result.ok:
                if result.status is AuthStatus.BAD_DIGEST:
                    return error_response(400, "BadDigest", "Content-MD5 does not match the body", rid)
                return error_response(401, "Unauthorized", "invalid or missing token", rid)
            auth = headers.get("Authorization", "")
            if not auth.startswith("EAS "):
                self._remember(auth)
        budget_s = service.timeout_ms / 1000.0
        raw = headers.get(HEADER_DEADLINE_MS)
        if raw is not None:
            # The caller's remaining budget (our SDK sends it): never run past it.
            try:
                deadline_ms = int(raw.strip())
            except ValueError:
                return error_response(400, "BadRequest", f"{HEADER_DEADLINE_MS} must be an integer", rid)
            if deadline_ms < 10:
                msg = "the caller's deadline has already passed"
                return error_response(408, "DeadlineExceeded", msg, rid)
            budget_s = min(budget_s, deadline_ms / 1000.0)
        req = WorkerRequest(
            body=body,
            subpath=tail,
            content_type=headers.get("Content-Type", DEFAULT_CONTENT_TYPE),
            request_id=rid,
            headers={k: v for k, v in headers.items() if k.lower().startswith("x-")},
            deadline=time.monotonic() + max(0.0, budget_s),
        )
        return await self.compute.run(req)

    def refused_before_body(self, headers: Any) -> bool:
        """A token is required and none is sent, or a raw token is wrong: 401 whatever the
        body holds, so it is answered before the body is read. (An ``EAS`` signature covers
        the body's MD5: it waits for the body.)"""
        auth = headers.get("Authorization")
        if not auth:
            return True
        if auth.startswith("EAS ") or auth in self._verified:
            return False
        if verify(self.tokens, headers, "", None).ok:
            self._remember(auth)
            return False
        return True

    # the lean protocol's hooks
    def accept(self, method: str, path: str, headers: Any, clen: int) -> bool:
        if method != "POST" or clen > self.gateway.max_body_bytes:
            return False  # aiohttp's 405 / 413
        if not (path == self.prefix or path.startswith(self.prefix + "/")):
            return False
        encoding = headers.get("Content-Encoding")
        return encoding is None or encoding.strip().lower() in ("", "identity")

    async def serve(self, req: FastRequest, query: Any) -> Reply:
        rid = pick_request_id(req.headers.get(HEADER_REQUEST_ID))
        tail = req.path[len(self.prefix) + 1 :]
        resp = await self.answer(req.headers, req.path, tail, req.body, rid)
        return Reply(resp.status, resp.body, resp.content_type, {HEADER_REQUEST_ID: rid})

    def early(self, req: FastRequest) -> Reply | None:
        """The lean protocol's ``early``: the 401 due before the body (still arriving)."""
        if not self.tokens or not self.refused_before_body(req.headers):
            return None
        return self._error(req.headers, 401, "Unauthorized", "invalid or missing token")

    def late(self, req: FastRequest) -> Reply:
        """The lean protocol's ``late``: a body not complete within body_timeout_s."""
        return self._error(req.headers, 408, "RequestTimeout", self._late_message())

    def _late_message(self) -> str:
        return f"request body not received within {self.gateway.body_timeout_s:g} s"

    def _error(self, headers: Any, status: int, code: str, message: str) -> Reply:
        rid = pick_request_id(headers.get(HEADER_REQUEST_ID))
        err = error_response(status, code, message, rid)
        return Reply(status, err.body, err.content_type, {HEADER_REQUEST_ID: rid})

    def app(self) -> Any:
        from aiohttp import web
        from aiohttp.web_protocol import RequestPayloadError

        def reply(resp: WorkerResponse, rid: str, close: bool = False) -> web.Response:
            out = web.Response(
                status=resp.status,
                body=resp.body,
                headers={"Content-Type": resp.content_type, HEADER_REQUEST_ID: rid},
            )
            if close:
                out.force_close()
            return out

        async def predict(request: web.Request) -> web.StreamResponse:
            rid = pick_request_id(request.headers.get(HEADER_REQUEST_ID))
            encoding = request.headers.get("Content-Encoding", "").strip().lower()
            if encoding not in ("", "identity"):
                # As the gateway: no compressed bodies (aiohttp would inflate them unasked).
                msg = f"Content-Encoding {encoding[:32]!r} is not supported"
                return reply(error_response(415, "UnsupportedMediaType", msg, rid), rid)
            if self.tokens and not request.content.is_eof() and self.refused_before_body(request.headers):
                return reply(error_response(401, "Unauthorized", "invalid or missing token", rid), rid)
            try:
                if request.content.is_eof():
                    body = await request.read()
                else:
                    # The gateway's body deadline (a chunked body, or one the lean protocol
                    # handed over): 408, and the connection closes.
                    body = await asyncio.wait_for(request.read(), self.gateway.body_timeout_s)
            except asyncio.TimeoutError:
                err = error_response(408, "RequestTimeout", self._late_message(), rid)
                return reply(err, rid, close=True)
            except RequestPayloadError:
                err = error_response(400, "BadRequest", "malformed request body", rid)
                return reply(err, rid, close=True)
            except ConnectionError:
                # The client left mid-body: nobody to answer, nothing worth a traceback.
                log.debug("client left before its body was complete (request %s)", rid)
                return reply(error_response(400, "BadRequest", "incomplete body", rid), rid, close=True)
            tail = request.match_info.get("tail", "")
            resp = await self.answer(request.headers, request.rel_url.raw_path, tail, body, rid)
            return reply(resp, rid)

        async def healthz(request: web.Request) -> web.StreamResponse:
            stats = self.compute.stats()
            if stats["unhealthy"]:
                return web.json_response({"status": "unhealthy", **stats}, status=503)
            return web.json_response({"status": "ok", **stats})

        app = web.Application(
            client_max_size=self.gateway.max_body_bytes,
            # As the gateway: an answer given before the body was read (401, 408) drains the
            # rest for this long, then the connection closes (aiohttp's default is 10 s).
            handler_args={"lingering_time": LINGER_S},
        )
        app.router.add_post(self.prefix, predict)
        app.router.add_post(self.prefix + "/{tail:.*}", predict)
        app.router.add_get("/healthz", healthz)
        return app
