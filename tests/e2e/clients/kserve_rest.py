"""Every call of KServe 0.21's ``InferenceRESTClient``, V2 and V1, with its defaults, against
a running gateway; run by tests/e2e/test_kserve_clients_e2e.py under .venv-clients.

    python kserve_rest.py BASE_URL TOKEN OUT_DIR

Writes OUT_DIR/results.json: each call's answer (tensors as lists) or its error.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput

MODEL = "mixed"


def inputs(binary: bool) -> list[InferInput]:
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    n = np.array([[1, -2, 3, 1 << 40], [0, 5, -7, 9]], dtype=np.int64)
    s = np.array([["héllo"], ["wörld"]], dtype=object)
    out = []
    for name, arr, datatype in (("x", x, "FP32"), ("n", n, "INT64"), ("s", s, "BYTES")):
        t = InferInput(name, list(arr.shape), datatype)
        t.set_data_from_numpy(arr, binary_data=binary)
        out.append(t)
    return out


def tensors(response: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model_version": getattr(response, "model_version", None)}
    for o in response.outputs:
        arr = o.as_numpy()
        values = [v.decode() if isinstance(v, bytes) else v for v in arr.ravel().tolist()]
        out[o.name] = {"datatype": o.datatype, "shape": list(arr.shape), "data": values}
    return out


async def v2(base: str, headers: dict[str, str]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    async with InferenceRESTClient(RESTConfig(protocol="v2")) as client:
        res["live"] = await client.is_server_live(base, headers=headers)
        res["ready"] = await client.is_server_ready(base, headers=headers)
        res["model_ready"] = await client.is_model_ready(base, MODEL, headers=headers)
        # infer() writes its own headers into the dict it is given: a fresh one per call.
        req = InferRequest(MODEL, inputs(True))
        res["binary"] = tensors(await client.infer(base, req, MODEL, headers=dict(headers)))
        req = InferRequest(MODEL, inputs(False))
        res["json"] = tensors(await client.infer(base, req, MODEL, headers=dict(headers)))
        wanted = [RequestedOutput("count", {"binary_data": True}), RequestedOutput("echo")]
        req = InferRequest(MODEL, inputs(True), request_outputs=wanted)
        res["subset"] = tensors(await client.infer(base, req, MODEL, headers=dict(headers)))
        try:
            await client.infer(base, InferRequest(MODEL, inputs(True)), MODEL)
            res["no_token"] = "succeeded"
        except httpx.HTTPStatusError as exc:
            res["no_token"] = f"{exc.response.status_code} {exc.response.json()['error']}"
    return res


async def v1(base: str, headers: dict[str, str]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    async with InferenceRESTClient(RESTConfig(protocol="v1")) as client:
        res["live"] = await client.is_server_live(base, headers=headers)
        res["model_ready"] = await client.is_model_ready(base, MODEL, headers=headers)
        instances = [
            {"x": [0.0, 0.125, 0.25, 0.375], "n": [1, -2, 3, 1 << 40], "s": ["héllo"]},
            {"x": [0.5, 0.625, 0.75, 0.875], "n": [0, 5, -7, 9], "s": ["wörld"]},
        ]
        res["predict"] = await client.infer(base, {"instances": instances}, MODEL, headers=headers)
    return res


async def main() -> None:
    base, token, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    headers = {"Authorization": f"Bearer {token}"}
    res = {"v2": await v2(base, headers), "v1": await v1(base, headers)}
    (out_dir / "results.json").write_text(json.dumps(res))


if __name__ == "__main__":
    asyncio.run(main())
