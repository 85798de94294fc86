"""An in-process WorkerPool over the real processors (no worker processes): fast route tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.config import GatewayConfig, ServiceConfig, parse_config
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.worker.processors.base import ProcessorError
from gateway.worker.processors.registry import create_processor
from tests.e2e.gateway_proc import DIGITS_MODEL
from tests.gateway.doubles import BackendDouble


class InProcPool(BackendDouble):
    def __init__(self, service: ServiceConfig, gateway: GatewayConfig) -> None:
        self.service = service
        self.processor = create_processor(service)
        self.calls = 0
        self.metadata: Any = None

    async def start(self) -> None:
        await asyncio.to_thread(self.processor.load)
        self.metadata = self.processor.metadata()  # what a ready worker reports

    async def stop(self, drain_timeout: float) -> None:
        self.processor.close()

    def ready_endpoints(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", 1)]

    async def dispatch(self, req: WorkerRequest, timeout: float) -> WorkerResponse:
        self.calls += 1
        try:
            return await asyncio.to_thread(self.processor.handle, req)
        except ProcessorError as exc:
            body = json.dumps({"code": exc.code, "message": exc.message}).encode()
            return WorkerResponse(exc.status, body, "application/json")


@contextlib.asynccontextmanager
async def digits_app(data_dir: Path) -> AsyncIterator[TestClient[Any, Any]]:
    """A client of the whole application serving the public ``digits`` model (every front,
    Cluster Serving's included), no access log."""
    config = parse_config(
        {
            "gateway": {"data_dir": str(data_dir), "access_log": False},
            "services": [{"name": "digits", "processor": "onnx", "model": str(DIGITS_MODEL), "public": True}],
        }
    )
    app = create_app(config, pool_factory=InProcPool, cluster_serving=True)
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as c:
        yield c
