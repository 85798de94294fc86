"""A call whose dtype or shape the model's signature refuses is refused by the gateway before
it is sent (in process over the real ONNX processor): the same 400 and message the processor
gives, and the backend never sees the call."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.codecs.cluster_serving import parse_request
from gateway.core.calls import WorkerRequest
from gateway.fronts.state import GATEWAY_KEY
from gateway.worker.processors.base import ProcessorError
from tests.gateway.routes.inproc import InProcPool, digits_app

CLUSTER = "/api/cluster-serving/digits/predict"
V2 = "/v2/models/digits/infer"


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    async with digits_app(tmp_path) as c:
        yield c


def _pool(client: TestClient[Any, Any]) -> InProcPool:
    pool = client.app[GATEWAY_KEY].backends["digits"]
    assert isinstance(pool, InProcPool)
    return pool


def _processor_says(pool: InProcPool, instances: list[Any]) -> str:
    """What the processor itself answers the batch the gateway would have sent it."""
    batch = parse_request(json.dumps({"instances": instances}).encode())
    req = WorkerRequest(batch.body, content_type="application/json")
    with pytest.raises(ProcessorError) as info:
        pool.processor.handle(req)
    assert info.value.status == 400
    return info.value.message


async def _post(client: TestClient[Any, Any], path: str, doc: Any) -> tuple[int, Any]:
    resp = await client.post(path, data=json.dumps(doc))
    return resp.status, json.loads(await resp.read())


@pytest.mark.parametrize(
    "value",
    [
        ["ab"] * 64,  # strings for a float input
        [[0.5] * 64],  # one dimension too many
        [0.5] * 63,  # a fixed dimension of the wrong size
        {"shape": [64], "dtype": "float64", "data": [0.5] * 64},  # a stated dtype the model has not
        {"shape": [8, 8], "dtype": "int32", "data": [1] * 64},  # both
    ],
)
async def test_cluster_serving_misfit_is_the_processors_400_unsent(
    client: TestClient[Any, Any], value: Any
) -> None:
    pool = _pool(client)
    instances = [{"input": value}, {"input": value}]
    expected = _processor_says(pool, instances)
    status, doc = await _post(client, CLUSTER, {"instances": instances})
    assert (status, doc) == (400, {"error": expected})
    assert pool.calls == 0
    # What fits goes on: ints for the float input are cast by the processor, as before.
    status, doc = await _post(client, CLUSTER, {"instances": [{"input": [1] * 64}]})
    assert status == 200 and len(doc["predictions"]) == 1, doc
    assert pool.calls == 1


async def test_v2_misfit_is_the_processors_400_unsent(client: TestClient[Any, Any]) -> None:
    pool = _pool(client)
    wrong = {"inputs": [{"name": "input", "datatype": "INT64", "shape": [2, 64], "data": [1] * 128}]}
    status, doc = await _post(client, V2, wrong)
    assert (status, doc) == (400, {"error": "input 'input': expected float32[N,64], got int64[2,64]"})
    assert pool.calls == 0
    # The processor's own words for the same tensors, when the call reaches it.
    pool.metadata = None  # no signature known: the call is sent, and refused there
    assert await _post(client, V2, wrong) == (status, doc)
    assert pool.calls == 1
