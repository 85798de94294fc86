"""KServe's own clients calling existing ``kserve.Model`` subclasses
(tests/e2e/kserve_custom_model.py) that a real gateway serves; run by
tests/e2e/test_kserve_model_e2e.py.

    python kserve_model_calls.py HOST:PORT HOST:GRPC_PORT TOKEN OUT_DIR

Writes OUT_DIR/results.json: each call's answer, or its error's status and message.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
from kserve import (
    InferenceGRPCClient,
    InferenceRESTClient,
    InferInput,
    InferRequest,
    InferResponse,
    RESTConfig,
)
from kserve.protocol.infer_type import RequestedOutput

X = np.array([[1.0, -2.0], [0.5, 0.25]], dtype=np.float32)


def answer(response: InferResponse) -> dict[str, Any]:
    outputs = {}
    for o in response.outputs:
        arr = o.as_numpy()
        values = [v.decode() if isinstance(v, bytes) else v for v in arr.reshape(-1).tolist()]
        outputs[o.name] = {"datatype": o.datatype, "shape": list(o.shape), "data": values}
    return {"model_name": response.model_name, "id": response.id, "outputs": outputs}


def x_input(binary: bool, datatype: str = "FP32", data: np.ndarray = X) -> InferInput:
    x = InferInput("x", list(data.shape), datatype)
    x.set_data_from_numpy(data, binary_data=binary)
    return x


async def main(base: str, grpc_host: str, token: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    res: dict[str, Any] = {}
    async with InferenceRESTClient(RESTConfig(protocol="v2")) as client:
        res["rest_ready"] = await client.is_model_ready(base, "scaler", headers=headers)
        for call, binary in (("rest_json", False), ("rest_binary", True)):
            params = {"tag": call, "top": 3}
            req = InferRequest("scaler", [x_input(binary)], request_id=f"{call}-7", parameters=params)
            res[call] = answer(await client.infer(base, req, "scaler", headers=dict(headers)))
        asked = InferRequest("scaler", [x_input(False)], request_outputs=[RequestedOutput("y")])
        res["rest_asked"] = answer(await client.infer(base, asked, "scaler", headers=dict(headers)))
        b = InferInput("b", [3], "UINT8")
        b.set_data_from_numpy(np.array([1, 2, 255], dtype=np.uint8), binary_data=True)
        counted = await client.infer(base, InferRequest("counter", [b]), "counter", headers=dict(headers))
        res["rest_counter"] = answer(counted)
        try:
            bad = InferRequest("scaler", [x_input(False, "INT32", X.astype(np.int32))])
            await client.infer(base, bad, "scaler", headers=dict(headers))
            res["rest_refused"] = "succeeded"
        except httpx.HTTPStatusError as exc:
            res["rest_refused"] = [exc.response.status_code, exc.response.json()]
    async with InferenceRESTClient(RESTConfig(protocol="v1")) as client:
        res["v1"] = await client.infer(base, {"instances": X.tolist()}, "scaler", headers=headers)
    async with InferenceGRPCClient(grpc_host) as client:
        metadata = (("authorization", headers["Authorization"]),)
        res["grpc_ready"] = await client.is_model_ready("scaler", headers=metadata)
        params = {"tag": "grpc", "top": 3, "exact": True}
        req = InferRequest("scaler", [x_input(False)], request_id="grpc-9", parameters=params)
        res["grpc"] = answer(await client.infer(req, headers=metadata))
        for call, model, inputs in (
            ("grpc_refused", "scaler", [x_input(False, "INT32", X.astype(np.int32))]),
            ("grpc_failed", "plain", [x_input(False)]),
        ):
            try:
                await client.infer(InferRequest(model, inputs), headers=metadata)
                res[call] = "succeeded"
            except grpc.RpcError as exc:
                res[call] = [exc.code().name, exc.details()]
    return res


if __name__ == "__main__":
    http_host, grpc_host, token, out_dir = sys.argv[1:5]
    results = asyncio.run(main(f"http://{http_host}", grpc_host, token))
    (Path(out_dir) / "results.json").write_text(json.dumps(results, default=str))
