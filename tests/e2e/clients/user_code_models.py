"""``tritonclient`` 2.73 (HTTP, binary and JSON tensors, and gRPC) and KServe 0.21's
``InferenceRESTClient`` (V2 and V1, predict and explain) and ``InferenceGRPCClient``, with
their defaults, calling user code (``python`` services that declare their tensors); run by
tests/e2e/test_user_code_models_e2e.py under .venv-clients.

    python user_code_models.py triton|kserve HOST:PORT HOST:GRPC_PORT TOKEN OUT_DIR

Writes OUT_DIR/<clients>.json: each call's answer (tensors as lists) or its error. One family
of clients per run: tritonclient's and kserve's gRPC modules register the same protobuf
messages, which one process refuses.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

X = np.array([[1.0, 2.0, 3.0], [0.5, 0.25, 0.25]], dtype=np.float32)
TAGS = np.array([b"cat", "d\u00f6g".encode()], dtype=object)


def plain(arr: Any) -> dict[str, Any]:
    arr = np.asarray(arr)
    values = [v.decode() if isinstance(v, bytes) else v for v in arr.ravel().tolist()]
    return {"dtype": str(arr.dtype), "shape": list(arr.shape), "data": values}


def triton(http_host: str, grpc_host: str, token: str) -> dict[str, Any]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    bearer = {"Authorization": f"Bearer {token}"}
    res: dict[str, Any] = {}
    http = httpclient.InferenceServerClient(http_host)
    res["metadata"] = http.get_model_metadata("scorer", headers=dict(bearer))
    res["ready"] = http.is_model_ready("scorer", headers=dict(bearer))
    for call, binary in (("binary", True), ("json", False)):
        x = httpclient.InferInput("x", list(X.shape), "FP32")
        x.set_data_from_numpy(X, binary_data=binary)
        tag = httpclient.InferInput("tag", [2], "BYTES")
        tag.set_data_from_numpy(TAGS, binary_data=binary)
        out = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("score", "label")]
        answer = http.infer("scorer", [x, tag], outputs=out, headers=dict(bearer))
        res[call] = {n: plain(answer.as_numpy(n)) for n in ("score", "label")}
    d = httpclient.InferInput("x", list(X.shape), "FP32")
    d.set_data_from_numpy(X)
    res["doubler"] = plain(http.infer("doubler", [d], headers=dict(bearer)).as_numpy("y"))
    for case, model, arr in (
        ("wrong_dtype", "scorer", X.astype(np.float64)),
        ("wrong_shape", "scorer", X[:, :2]),
        ("undeclared", "plain", X),
    ):
        t = httpclient.InferInput("x", list(arr.shape), "FP64" if arr.dtype == np.float64 else "FP32")
        t.set_data_from_numpy(arr)
        tag = httpclient.InferInput("tag", [2], "BYTES")
        tag.set_data_from_numpy(TAGS)
        try:
            http.infer(model, [t, tag], headers=dict(bearer))
            res[case] = "succeeded"
        except InferenceServerException as exc:
            res[case] = f"{exc.status()} {exc.message()}"
    http.close()

    g = grpcclient.InferenceServerClient(grpc_host)
    auth = {"authorization": bearer["Authorization"]}
    res["grpc_metadata"] = g.get_model_metadata("scorer", headers=auth, as_json=True)
    x = grpcclient.InferInput("x", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    tag = grpcclient.InferInput("tag", [2], "BYTES")
    tag.set_data_from_numpy(TAGS)
    answer = g.infer("scorer", [x, tag], headers=auth)
    res["grpc"] = {n: plain(answer.as_numpy(n)) for n in ("score", "label")}
    try:
        g.infer("plain", [x], headers=auth)
        res["grpc_undeclared"] = "succeeded"
    except InferenceServerException as exc:
        res["grpc_undeclared"] = f"{exc.status()} {exc.message()}"
    g.close()
    return res


def kserve_inputs(binary: bool) -> list[Any]:
    from kserve import InferInput

    x = InferInput("x", list(X.shape), "FP32")
    x.set_data_from_numpy(X, binary_data=binary)
    tag = InferInput("tag", [2], "BYTES")
    tag.set_data_from_numpy(TAGS, binary_data=binary)
    return [x, tag]


def outputs(response: Any) -> dict[str, Any]:
    return {o.name: plain(o.as_numpy()) for o in response.outputs}


async def kserve(base: str, grpc_host: str, token: str) -> dict[str, Any]:
    import grpc
    import httpx
    from kserve import InferenceGRPCClient, InferenceRESTClient, InferRequest, RESTConfig

    headers = {"Authorization": f"Bearer {token}"}
    res: dict[str, Any] = {}
    async with InferenceRESTClient(RESTConfig(protocol="v2")) as client:
        res["v2_ready"] = await client.is_model_ready(base, "scorer", headers=headers)
        for call, binary in (("v2_binary", True), ("v2_json", False)):
            req = InferRequest("scorer", kserve_inputs(binary))
            res[call] = outputs(await client.infer(base, req, "scorer", headers=dict(headers)))
    async with InferenceRESTClient(RESTConfig(protocol="v1")) as client:
        res["v1_ready"] = await client.is_model_ready(base, "scorer", headers=headers)
        instances = [{"x": X[i].tolist(), "tag": TAGS[i].decode()} for i in range(2)]
        res["v1_predict"] = await client.infer(base, {"instances": instances}, "scorer", headers=headers)
        res["v1_explain"] = await client.explain(base, "scorer", {"instances": instances}, headers=headers)
        try:
            await client.explain(base, "attribution", {"instances": [X[0].tolist()]}, headers=headers)
            res["v1_no_explainer"] = "succeeded"
        except httpx.HTTPStatusError as exc:
            res["v1_no_explainer"] = f"{exc.response.status_code} {exc.response.json()['error']}"
    async with InferenceGRPCClient(grpc_host) as client:
        metadata = (("authorization", headers["Authorization"]),)
        res["grpc_ready"] = await client.is_model_ready("scorer", headers=metadata)
        answer = await client.infer(InferRequest("scorer", kserve_inputs(False)), headers=metadata)
        res["grpc"] = outputs(answer)
        try:
            await client.infer(InferRequest("plain", kserve_inputs(False)), headers=metadata)
            res["grpc_undeclared"] = "succeeded"
        except grpc.RpcError as exc:
            res["grpc_undeclared"] = f"{exc.code().name} {exc.details()}"
    return res


def main() -> None:
    family, http_host, grpc_host, token, out_dir = sys.argv[1:6]
    if family == "triton":
        res = triton(http_host, grpc_host, token)
    else:
        res = asyncio.run(kserve(f"http://{http_host}", grpc_host, token))
    (Path(out_dir) / f"{family}.json").write_text(json.dumps(res, default=str))


if __name__ == "__main__":
    main()
