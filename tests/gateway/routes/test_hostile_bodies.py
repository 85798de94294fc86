"""Every protocol's route, in process over the real ONNX processor, fed random and hostile
bodies: each is answered with a 4xx (or a 200), never a 5xx, and the app keeps serving."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.gateway.routes.inproc import digits_app

PATHS = [
    "/api/predict/digits",
    "/api/cluster-serving/digits/predict",
    "/v2/models/digits/infer",
    "/v1/models/digits:predict",
]
VALID = {"instances": [{"input": [0.5] * 64}]}


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    async with digits_app(tmp_path) as c:
        yield c


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 4 or roll < 0.3:
        return rng.choice(
            [None, True, 0, -1, 1 << 70, 1.5, float("inf"), "", "x" * rng.randint(0, 50), "float32",
             "U100000000", "FP32", "BYTES", [], {}]
        )  # fmt: skip
    if roll < 0.6:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["instances", "inputs", "outputs", "name", "shape", "datatype", "dtype", "data", "parameters",
            "input", "b64", "indices", "signature_name"]  # fmt: skip
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _bodies() -> list[bytes]:
    rng = random.Random(15)
    out = [
        b"", b"{", b"\xff\xfe", b"[" * 100_000, b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        json.dumps({"instances": [{"input": {"shape": [1 << 40], "dtype": "float32", "data": [1]}}]})
        .encode(),
        json.dumps({"inputs": [{"name": "input", "shape": [1 << 40, 1 << 40], "datatype": "FP32",
                                "data": [1.0]}]}).encode(),
        json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "BYTES",
                                "data": ["a" * 100_000] + [""] * 63}]}).encode(),
        json.dumps({"instances": ["a" * 100_000] + [""] * 20_000}).encode(),
    ]  # fmt: skip
    out += [json.dumps(_random_json(rng), allow_nan=True).encode() for _ in range(120)]
    out += [rng.randbytes(rng.randint(1, 200)) for _ in range(30)]
    return out


async def test_no_body_gets_a_5xx_on_any_route(client: TestClient[Any, Any]) -> None:
    bodies = _bodies()
    failures = []
    seen: dict[int, int] = {}
    for path in PATHS:
        for body in bodies:
            resp = await client.post(path, data=body, headers={"Content-Type": "application/json"})
            await resp.read()
            seen[resp.status] = seen.get(resp.status, 0) + 1
            if resp.status >= 500:
                failures.append((path, resp.status, body[:80]))
    assert not failures, failures[:5]
    assert sum(seen.values()) == len(PATHS) * len(bodies) and set(seen) <= {200, 400, 413, 415}, seen
    resp = await client.post(PATHS[1], json=VALID)
    assert resp.status == 200, await resp.text()
