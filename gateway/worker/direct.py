"""The worker's direct-mode HTTP endpoint: ``POST /api/predict/<service>[/<subpath>]`` for
direct-mode clients, and ``GET /healthz``.

An adapter over the worker's own dataplane (gateway/core/dataplane.py) whose backend is the
compute queue, so a direct call gets exactly the gateway's checks, header policy and
errors without the hop through the gateway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

from eas_sdk._core.constants import HEADER_REQUEST_ID
from gateway.codecs.errors import Shape, render
from gateway.config import GatewayConfig, ServiceConfig
from gateway.core import errors
from gateway.core.auth import SignaturePolicy, replay_cache
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.core.dataplane import Body, DataPlane
from gateway.core.metadata import ModelMetadata
from gateway.http.middleware import pick_request_id
from gateway.lean_http import LINGER_S, FastRequest, Reply
from gateway.worker.compute import ComputeQueue

log = logging.getLogger("gateway.worker")


class ComputeBackend:
    """The compute queue as the dataplane's backend (the worker's own dataplane).

    A call runs on the compute thread, so that the event loop goes on reading the calls that
    arrive meanwhile and hands them over together. When calls come one at a time (the last
    turn of the event loop saw at most one, this is the first of its turn and nothing is
    queued), it runs in the event loop instead, as the framed RPC's calls do: no hand-over to
    the thread and back, two switches between threads less per call (at one call in flight,
    a p50 of about 150 instead of 175 µs for the digits model; under load nothing changes).
    A run that turns out long is moved to the thread by the compute queue's watchdog."""

    # Direct calls arrive as HTTP bodies: there are no arrays to hand over.
    takes_tensors = False

    def __init__(self, compute: ComputeQueue) -> None:
        self.compute = compute
        self._calls = 0  # calls in this turn of the event loop
        self._last = 0  # calls in the last turn that had any

    @property
    def metadata(self) -> ModelMetadata | None:
        """What the loaded processor reports (the worker's own model)."""
        return self.compute.processor.metadata()

    def dispatch(self, req: WorkerRequest, timeout: float) -> Awaitable[WorkerResponse]:
        # req.deadline bounds the run: the dataplane set it from ``timeout``.
        compute = self.compute
        self._calls += 1
        if self._calls == 1:
            compute.loop.call_soon(self._turn_over)
            resp = compute.run_inline(req) if self._last <= 1 else None
            if resp is not None:
                done: asyncio.Future[WorkerResponse] = compute.loop.create_future()
                done.set_result(resp)
                return done
        # The compute queue's own coroutine, not a wrapper around it: one frame less per call.
        return compute.run(req)

    def _turn_over(self) -> None:
        self._last, self._calls = self._calls, 0


def _reply(exc: errors.GatewayError, rid: str) -> Reply:
    """The gateway's EAS error answer, as its lean front writes it."""
    answer = render(exc, Shape.EAS, rid)
    return Reply(answer.status, answer.body, answer.content_type, {**answer.headers, HEADER_REQUEST_ID: rid})


class DirectHTTP:
    """The worker's direct-mode port: an adapter over the worker's own dataplane, so a direct
    call gets the gateway's checks, header policy and errors. Plain calls are served by the
    lean protocol (gateway/lean_http/), everything else by aiohttp (``app``); every reply
    carries ``X-Request-Id`` (the caller's when well-formed, else a fresh one)."""

    def __init__(self, service: ServiceConfig, gateway: GatewayConfig, compute: ComputeQueue) -> None:
        self.service = service
        self.gateway = gateway
        self.compute = compute
        self.prefix = f"/api/predict/{service.name}"
        self.plane = DataPlane(
            [service], {service.name: ComputeBackend(compute)},
            signature=SignaturePolicy.of(gateway), replay=replay_cache(gateway),
            max_response_bytes=gateway.max_response_bytes,
        )  # fmt: skip

    async def answer(self, headers: Any, raw_path: str, tail: str, body: Body, rid: str) -> WorkerResponse:
        """One predict call (``body``: the bytes, or a reader for one still arriving); a
        refusal raises a GatewayError."""
        return await self.plane.predict_call(
            self.service, headers, raw_path, body, subpath=tail, request_id=rid, arrived=time.monotonic()
        )

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
        try:
            resp = await self.answer(req.headers, req.path, tail, req.body, rid)
        except errors.GatewayError as exc:
            return _reply(exc, rid)
        return Reply(resp.status, resp.body, resp.content_type, {HEADER_REQUEST_ID: rid})

    def early(self, req: FastRequest) -> Reply | None:
        """The lean protocol's ``early``: the 401 due before the body (still arriving). This
        port holds no bytes against an admission budget (no ``admit``): what the core held
        for the body's arrival is given back at once."""
        try:
            self.plane.body_arriving(self.service, req.headers, 0).release()
        except errors.GatewayError as exc:
            return _reply(exc, pick_request_id(req.headers.get(HEADER_REQUEST_ID)))
        return None

    def late(self, req: FastRequest) -> Reply:
        """The lean protocol's ``late``: a body not complete within body_timeout_s."""
        timeout = self.gateway.body_timeout_s
        exc = errors.RequestTimeout(f"request body not received within {timeout:g} s", close=True)
        return _reply(exc, pick_request_id(req.headers.get(HEADER_REQUEST_ID)))

    def app(self) -> Any:
        from aiohttp import web

        from gateway.http.body import RequestBody
        from gateway.http.middleware import REQUEST_ID_KEY, gateway_middleware

        async def predict(request: web.Request) -> web.StreamResponse:
            rid = request[REQUEST_ID_KEY]
            gw = self.gateway
            body = RequestBody(request, gw.max_body_bytes, gw.body_timeout_s, hold_limit=gw.max_body_bytes)
            # The raw sub-path, as the lean path and the gateway pass it on.
            raw_path = request.rel_url.raw_path
            tail = raw_path[len(self.prefix) + 1 :]
            try:
                resp = await self.answer(request.headers, raw_path, tail, body, rid)
            except ConnectionError:
                # The client left mid-body: nobody to answer, nothing worth a traceback.
                log.debug("client left before its body was complete (request %s)", rid)
                raise errors.BadRequest("incomplete body", close=True) from None
            return web.Response(
                status=resp.status, body=resp.body, headers={"Content-Type": resp.content_type}
            )

        async def healthz(request: web.Request) -> web.StreamResponse:
            stats = self.compute.stats()
            if stats["unhealthy"]:
                return web.json_response({"status": "unhealthy", **stats}, status=503)
            return web.json_response({"status": "ok", **stats})

        app = web.Application(
            # The gateway's error shape and request ids for everything this port answers.
            middlewares=[gateway_middleware],
            client_max_size=self.gateway.max_body_bytes,
            # As the gateway: an answer given before the body was read (401, 408) drains the
            # rest for this long, then the connection closes (aiohttp's default is 10 s).
            handler_args={"lingering_time": LINGER_S, "auto_decompress": False},
        )
        app.router.add_post(self.prefix, predict)
        app.router.add_post(self.prefix + "/{tail:.*}", predict)
        app.router.add_get("/healthz", healthz)
        return app
