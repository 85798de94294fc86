"""Model versions on the V2 routes, in process: each version answers from its own pool, the
path without a version from the latest, and a version without a pool is unknown, never a
server error."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.config import Config, GatewayConfig, ServiceConfig
from gateway.config.versions import version_services
from gateway.core.metadata import ModelMetadata, TensorSpec
from gateway.fronts.routes import kserve
from gateway.fronts.state import GATEWAY_KEY
from tests.gateway.doubles import BackendDouble, double_service
from tests.gateway.parts import gateway_parts

OLD = ModelMetadata(
    (TensorSpec("x", "FP32", (-1, 4)),), (TensorSpec("y", "FP32", (-1, 4)),), "onnxruntime_onnx"
)
NEW = ModelMetadata(
    (TensorSpec("x", "FP32", (-1, 8)),), (TensorSpec("y", "FP32", (-1, 8)),), "onnxruntime_onnx"
)


@dataclass
class _Pool(BackendDouble):
    metadata: ModelMetadata | None = None
    ready: bool = True
    service: ServiceConfig = field(default_factory=lambda: double_service("m"))


async def _serve(with_old_pool: bool) -> TestClient:
    svc = ServiceConfig(
        name="m", processor="onnx", model="b.onnx", versions=(("1", "a.onnx"), ("2", "b.onnx"))
    )
    served = version_services(svc)
    older = [s for s in served.values() if s is not svc]
    pools = {"m": _Pool(NEW)}
    if with_old_pool:
        pools["m@1"] = _Pool(OLD)
    app = web.Application()
    app[GATEWAY_KEY] = gateway_parts(
        Config(GatewayConfig(), (svc,)), pools, served=[svc, *older], started=True
    )
    kserve.setup(app)
    client = TestClient(TestServer(app, host="127.0.0.1", port=0))
    await client.start_server()
    return client


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    c = await _serve(with_old_pool=True)
    yield c
    await c.close()


async def test_each_version_answers_from_its_own_pool(client: TestClient) -> None:
    latest = await (await client.get("/v2/models/m")).json()
    assert latest["versions"] == ["1", "2"] and latest["inputs"][0]["shape"] == [-1, 8]
    assert await (await client.get("/v2/models/m/versions/2")).json() == latest
    old = await (await client.get("/v2/models/m/versions/1")).json()
    assert old["inputs"][0]["shape"] == [-1, 4] and old["versions"] == ["1", "2"]
    assert (await client.get("/v2/models/m/versions/1/ready")).status == 200
    resp = await client.get("/v2/models/m/versions/3/ready")
    assert resp.status == 404 and await resp.json() == {"error": "model 'm' has no version '3'"}
    index = await (await client.post("/v2/repository/index")).json()
    assert [(e["name"], e["version"], e["state"]) for e in index] == [
        ("m", "1", "READY"),
        ("m", "2", "READY"),
    ]
    stats = await (await client.get("/v2/models/m/stats")).json()
    assert [(s["name"], s["version"]) for s in stats["model_stats"]] == [("m", "1"), ("m", "2")]
    cfg = await (await client.get("/v2/models/m/versions/1/config")).json()
    assert cfg["version_policy"] == {"all": {}} and cfg["input"][0]["dims"] == [-1, 4]


async def test_a_version_without_a_pool_is_unknown_not_a_server_error() -> None:
    client = await _serve(with_old_pool=False)
    try:
        assert (await client.get("/v2/models/m/versions/1")).status == 404
        index = await (await client.post("/v2/repository/index")).json()
        assert [e["version"] for e in index] == ["2"]
        assert (await client.get("/v2/models/m/versions/2/ready")).status == 200
    finally:
        await client.close()
