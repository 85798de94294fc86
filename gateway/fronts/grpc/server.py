"""Starting and stopping the gRPC server with the application.

:func:`grpc_lifecycle` is an aiohttp cleanup context: registered after the one that
starts the worker pools, it starts listening once they are starting and stops (letting
in-flight calls finish for up to ``shutdown_timeout_s``) before they stop. The server is
``grpc.aio``'s, on the gateway's own event loop, so a call costs no thread hop.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from aiohttp import web

from gateway._proto import grpc_service_pb2_grpc as pb_grpc
from gateway.config import GatewayConfig
from gateway.config.tls import TlsConfig
from gateway.core.tls import ServerTls
from gateway.fronts.grpc.servicer import InferenceServicer
from gateway.fronts.state import GATEWAY_KEY

log = logging.getLogger("gateway.grpc")


def server_options(gw: GatewayConfig) -> list[tuple[str, Any]]:
    return [
        # A request message is bounded as an HTTP body is; a larger one gets RESOURCE_EXHAUSTED
        # from gRPC itself before any of it is parsed.
        ("grpc.max_receive_message_length", gw.max_body_bytes),
        # Never share the port with another process silently (gRPC sets SO_REUSEPORT by default).
        ("grpc.so_reuseport", 0),
    ]


class GrpcTls:
    """TLS on the gRPC port from files, loaded again on SIGHUP: grpcio asks for the
    certificate configuration at each new handshake, and is handed the new one once after a
    reload (connections already open keep theirs)."""

    def __init__(self, cfg: TlsConfig) -> None:
        self.tls = ServerTls(cfg, alpn=())  # checks the files as the HTTP port's do
        self.require_client = cfg.client_auth == "required"
        self._next: Any = None

    def _configuration(self) -> Any:
        cert, key, ca = self.tls.read_files()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(), self._fetch, require_client_authentication=self.require_client
        )

    def _fetch(self) -> Any:
        pending, self._next = self._next, None
        return pending  # None: keep the configuration in use

    def reload(self) -> None:
        self.tls.reload()  # raises TlsError on files that do not load: nothing changes
        self._next = self._configuration()


def listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_server(app: web.Application) -> grpc.aio.Server:
    """A started server for ``app`` on ``gateway.host:gateway.grpc_port``; OSError if it cannot listen."""
    gw = app[GATEWAY_KEY].config.gateway
    server = grpc.aio.server(options=server_options(gw))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(app), server)
    address = listen_address(gw.host, gw.grpc_port)
    tls_cfg = gw.grpc_tls or gw.tls
    try:
        if tls_cfg is None:
            server.add_insecure_port(address)
        else:
            tls = GrpcTls(tls_cfg)
            server.add_secure_port(address, tls.credentials())
            app[GATEWAY_KEY].state.tls_reloads.append(tls.reload)
    except RuntimeError as exc:
        raise OSError(f"cannot listen for gRPC on {address}: {exc}") from None
    await server.start()
    log.info("gRPC listening on %s%s", address, " (TLS)" if tls_cfg is not None else "")
    return server


async def grpc_lifecycle(app: web.Application) -> AsyncIterator[None]:
    server = await start_server(app)
    try:
        yield
    finally:
        await server.stop(app[GATEWAY_KEY].config.gateway.shutdown_timeout_s)


__all__ = ["grpc_lifecycle", "listen_address", "server_options", "start_server"]
