"""One real gateway for every documentation example: ``samples/services.yaml`` as a user
starts it, on a free port with a private data directory, with the V2 gRPC endpoint on."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.e2e.gateway_proc import ROOT, GatewayProcess


@dataclass
class DocsGateway:
    process: GatewayProcess
    grpc_port: int

    @property
    def addresses(self) -> dict[str, str]:
        """The addresses the pages show -> where this gateway answers."""
        http, grpc = self.process.endpoint, f"127.0.0.1:{self.grpc_port}"
        shown = {"127.0.0.1:8080": http, "localhost:8080": http}
        return {**shown, "127.0.0.1:8001": grpc, "localhost:8001": grpc}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def docs_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsGateway]:
    config = yaml.safe_load((ROOT / "samples" / "services.yaml").read_text())
    grpc_port = _free_port()
    config.setdefault("gateway", {})["grpc_port"] = grpc_port  # the pages show it on 8001
    workdir: Path = tmp_path_factory.mktemp("docs-gateway")
    gw = GatewayProcess.start(config, workdir)
    try:
        for service in ("digits", "echo", "cs"):
            gw.wait_workers_ready(service, 1)
        yield DocsGateway(gw, grpc_port)
    finally:
        gw.stop()
