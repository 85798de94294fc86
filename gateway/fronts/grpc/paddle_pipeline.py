"""Paddle Serving's pipeline gRPC service on each port a service names (its ``rpc_port``).

``baidu.paddle_serving.pipeline_serving.PipelineService/inference``, as paddle-serving-server's
``PipelineClient`` calls it, answered for the one service whose port it is. Each call only
translates: the request's bytes are the body of one ``DataPlane.arrays_call`` (the
``authorization`` metadata checked as a token, the call's deadline as its budget), decoded
by gateway.codecs.paddle_pipeline once the call is admitted, and the outputs are written in
Paddle's answer. A failure is answered as Paddle's server answers it: status OK with
``err_no``/``err_msg`` (gateway/codecs/errors.py), never a gRPC error, so the client reads
it where it reads any answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from aiohttp import web

from eas_sdk._core.constants import HEADER_DEADLINE_MS
from gateway.codecs import paddle_pipeline
from gateway.codecs.errors import gateway_error, paddle_pipeline_error
from gateway.config import ServiceConfig
from gateway.core.logs import ACCESS_LOGGER, log_access
from gateway.fronts.grpc.server import listen_address, server_options
from gateway.fronts.grpc.servicer import auth_headers, remote
from gateway.fronts.state import GATEWAY_KEY
from gateway.http.middleware import new_request_id

log = logging.getLogger("gateway.grpc")


class PipelineService:
    """The ``inference`` call for one service, on the raw request bytes."""

    def __init__(self, app: web.Application, service: str) -> None:
        self.parts = app[GATEWAY_KEY]
        self.service = service
        # Disabled unless access logs are on (gateway.access_log), as for HTTP calls.
        self.access_log = logging.getLogger(ACCESS_LOGGER) if self.parts.config.gateway.access_log else None

    async def inference(self, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        rid = new_request_id()
        started = time.perf_counter()
        status = 200
        try:
            answer = await self._infer(body, context, rid)
        except Exception as exc:  # every failure is an answer in Paddle's form
            err = gateway_error(exc)
            if err is None:
                log.error("pipeline call to %s failed", self.service, exc_info=exc)
            status = err.status if err is not None else 500
            answer = paddle_pipeline.error(*paddle_pipeline_error(exc))
        if self.service in self.parts.backends:
            self.parts.metrics.observe(self.service, status, time.perf_counter() - started)
        if self.access_log is not None and self.access_log.isEnabledFor(logging.INFO):
            ms = (time.perf_counter() - started) * 1000.0
            log_access(
                self.access_log,
                remote(context.peer()),
                "GRPC",
                paddle_pipeline.METHOD_PATH,
                status,
                len(answer),
                ms,
                rid,
            )
        return answer

    async def _infer(self, body: bytes, context: grpc.aio.ServicerContext, rid: str) -> bytes:
        arrived = time.monotonic()
        plane = self.parts.dataplane
        headers = auth_headers(context)
        remaining = context.time_remaining()
        if remaining is not None:  # the client's deadline, as a caller's deadline header
            headers[HEADER_DEADLINE_MS] = str(int(remaining * 1000))

        async def decode(data: bytes) -> tuple[paddle_pipeline.PipelineCall, bytes]:
            call = paddle_pipeline.parse(data)
            return call, call.json_form()

        call, outputs = await plane.arrays_call(
            self.service, headers, paddle_pipeline.METHOD_PATH, body, decode, request_id=rid,
            arrived=arrived, max_values=self.parts.config.gateway.max_json_values,
        )  # fmt: skip
        return paddle_pipeline.answer(outputs, call.fetch)


def _handler(service: PipelineService) -> grpc.GenericRpcHandler:
    # No request deserializer: the bytes go to the dataplane as a body, read once it admits them.
    method = grpc.unary_unary_rpc_method_handler(service.inference)
    return grpc.method_handlers_generic_handler(paddle_pipeline.SERVICE, {"inference": method})


async def start_servers(app: web.Application, services: tuple[ServiceConfig, ...]) -> list[Any]:
    """One started server per service with an ``rpc_port``; OSError if one cannot listen."""
    gw = app[GATEWAY_KEY].config.gateway
    servers: list[Any] = []
    try:
        for svc in services:
            if not svc.rpc_port:
                continue
            server = grpc.aio.server(options=server_options(gw))
            server.add_generic_rpc_handlers((_handler(PipelineService(app, svc.name)),))
            address = listen_address(gw.host, svc.rpc_port)
            try:
                server.add_insecure_port(address)
            except RuntimeError as exc:
                raise OSError(f"cannot listen for {svc.name}'s rpc_port on {address}: {exc}") from None
            await server.start()
            servers.append(server)
            log.info("Paddle pipeline service of %s listening on %s", svc.name, address)
    except BaseException:
        for server in servers:
            await server.stop(0)
        raise
    return servers


async def paddle_pipeline_lifecycle(app: web.Application) -> AsyncIterator[None]:
    parts = app[GATEWAY_KEY]
    servers = await start_servers(app, parts.config.services)
    try:
        yield
    finally:
        for server in servers:
            await server.stop(parts.config.gateway.shutdown_timeout_s)


__all__ = ["PipelineService", "paddle_pipeline_lifecycle", "start_servers"]
