"""KServe model metadata comes from the pool (what the processor reported), in process:
before any worker has been ready the model answers as KServe's not-ready model does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.config import Config, GatewayConfig, ServiceConfig
from gateway.core.metadata import ModelMetadata, TensorSpec
from gateway.fronts.routes import kserve
from gateway.fronts.state import GATEWAY_KEY
from tests.gateway.doubles import BackendDouble, double_service
from tests.gateway.parts import gateway_parts

TOKEN = "kserve-meta-token-5c1d2e"
META = ModelMetadata(
    (TensorSpec("input", "FP32", (-1, 64)),),
    (TensorSpec("label", "INT64", (-1,)), TensorSpec("probabilities", "FP32", (-1, 10))),
    platform="onnxruntime_onnx",
)


@dataclass
class _Pool(BackendDouble):
    metadata: ModelMetadata | None = None
    ready: bool = False
    service: ServiceConfig = field(default_factory=lambda: double_service("m"))


@pytest.fixture
async def served() -> AsyncIterator[tuple[TestClient, dict[str, _Pool]]]:
    services = (
        ServiceConfig(name="m", processor="onnx", model="m.onnx"),
        ServiceConfig(name="locked", processor="onnx", model="m.onnx", token=TOKEN),
    )
    app = web.Application()
    pools = {"m": _Pool(), "locked": _Pool()}
    app[GATEWAY_KEY] = gateway_parts(Config(GatewayConfig(), services), pools)
    kserve.setup(app)
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
        yield client, pools


async def test_metadata_before_any_worker_was_ready_is_503_model_not_ready(
    served: tuple[TestClient, dict[str, _Pool]],
) -> None:
    client, _ = served
    for path in ("/v2/models/m", "/v2/models/m/versions/1"):
        resp = await client.get(path)
        assert resp.status == 503
        assert await resp.json() == {"error": "model 'm' is not ready: it has no ready worker"}
        assert resp.headers["Retry-After"] == "1"
    resp = await client.get("/v2/models/m/ready")
    assert resp.status == 503 and await resp.json() == {"name": "m", "ready": False}
    # A token-protected model says nothing, not even "not ready", to a caller without its token.
    assert (await client.get("/v2/models/locked")).status == 401
    assert (await client.get("/v2/models/locked", headers={"Authorization": TOKEN})).status == 503


async def test_metadata_is_what_the_pool_holds(served: tuple[TestClient, dict[str, _Pool]]) -> None:
    client, pools = served
    pools["m"].metadata = META
    resp = await client.get("/v2/models/m")
    assert resp.status == 200
    assert await resp.json() == {
        "name": "m",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}],
        "outputs": [
            {"name": "label", "datatype": "INT64", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
        ],
    }
    # Metadata describes the model, not its availability: kept while workers restart.
    assert (await client.get("/v2/models/m/ready")).status == 503
