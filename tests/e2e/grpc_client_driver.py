"""Drive a real V2 gRPC client against the gateway; run by .venv-clients' python.

    python grpc_client_driver.py triton|kserve  < {"url", "token", "inputs": {...}}  > {results}

``tritonclient.grpc`` and ``kserve`` register the same protobuf package, so each runs in
its own process. Every client runs with its default settings; results (and the status of
calls that must fail) are printed as one JSON document for the test to check against
ONNX Runtime.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np


def enc(arr: np.ndarray) -> dict[str, Any]:
    data = [v.decode() if isinstance(v, bytes) else v for v in arr.ravel().tolist()]
    return {"dtype": str(arr.dtype), "shape": list(arr.shape), "data": data}


def dec(doc: dict[str, Any]) -> np.ndarray:
    if doc["dtype"] == "object":
        return np.array([v.encode() for v in doc["data"]], dtype=object).reshape(doc["shape"])
    return np.array(doc["data"], dtype=doc["dtype"]).reshape(doc["shape"])


V2 = {"float32": "FP32", "int64": "INT64", "float64": "FP64", "object": "BYTES"}


def triton(url: str, token: str, inputs: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    auth = {"authorization": f"Bearer {token}"}

    def tensors(arrays: dict[str, np.ndarray]) -> list[Any]:
        out = []
        for name, arr in arrays.items():
            t = grpcclient.InferInput(name, list(arr.shape), V2[str(arr.dtype)])
            t.set_data_from_numpy(arr)
            out.append(t)
        return out

    def result(r: Any) -> dict[str, Any]:
        names = [o.name for o in r.get_response().outputs]
        return {"order": names, "outputs": {n: enc(r.as_numpy(n)) for n in names}}

    def status(fn: Any) -> str | None:
        try:
            fn()
        except InferenceServerException as exc:
            return str(exc.status())
        return None

    res: dict[str, Any] = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "model_ready": client.is_model_ready("digits", headers=auth),
        "server_metadata": client.get_server_metadata(as_json=True),
        "model_metadata": client.get_model_metadata("multi", as_json=True),
        "model_config": client.get_model_config("digits", headers=auth, as_json=True),
        "index": client.get_model_repository_index(as_json=True),
    }
    res["digits"] = result(client.infer("digits", tensors(inputs["digits"]), headers=auth))
    subset = [grpcclient.InferRequestedOutput("yy"), grpcclient.InferRequestedOutput("sum")]
    res["multi_subset"] = result(client.infer("multi", tensors(inputs["multi"]), outputs=subset))
    res["multi_gzip"] = result(client.infer("multi", tensors(inputs["multi"]), compression_algorithm="gzip"))
    res["strings"] = result(client.infer("strings", tensors(inputs["strings"])))
    streamed: list[Any] = []
    client.start_stream(callback=lambda result, error: streamed.append((result, error)))
    client.async_stream_infer("multi", tensors(inputs["multi"]), request_id="s-1")
    client.async_stream_infer("nosuch", tensors(inputs["multi"]), request_id="s-2")
    client.async_stream_infer("strings", tensors(inputs["strings"]), request_id="s-3")
    client.stop_stream()  # waits for every answer
    res["stream"] = [
        {"id": r.get_response().id, **result(r)} if err is None else {"error": str(err)}
        for r, err in streamed
    ]
    res["stats"] = client.get_inference_statistics("digits", headers=auth, as_json=True)
    bad_shape = {"x": inputs["multi"]["x"][:, :3], **{k: v for k, v in inputs["multi"].items() if k != "x"}}
    res["errors"] = {
        "no_token": status(lambda: client.infer("digits", tensors(inputs["digits"]))),
        "wrong_token": status(
            lambda: client.infer(
                "digits", tensors(inputs["digits"]), headers={"authorization": "Bearer wrong"}
            )
        ),
        "unknown_model": status(lambda: client.infer("nosuch", tensors(inputs["digits"]))),
        "bad_shape": status(lambda: client.infer("multi", tensors(bad_shape))),
        "unknown_output": status(
            lambda: client.infer(
                "multi", tensors(inputs["multi"]), outputs=[grpcclient.InferRequestedOutput("nope")]
            )
        ),
        "load": status(lambda: client.load_model("multi")),
    }
    client.close()
    return res


async def kserve(url: str, token: str, inputs: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    from kserve import InferenceGRPCClient, InferInput, InferRequest
    from kserve.protocol.infer_type import RequestedOutput

    auth = (("authorization", f"Bearer {token}"),)

    def request(model: str, arrays: dict[str, np.ndarray], typed: bool, **kw: Any) -> Any:
        tensors = []
        for name, arr in arrays.items():
            t = InferInput(name, list(arr.shape), V2[str(arr.dtype)])
            if typed:  # plain lists: typed InferTensorContents on the wire
                t.set_data_from_numpy(arr, binary_data=False)
            else:  # numpy: raw_input_contents
                t.set_data_from_numpy(arr)
            tensors.append(t)
        return InferRequest(model_name=model, infer_inputs=tensors, **kw)

    def result(r: Any) -> dict[str, Any]:
        return {
            "order": [o.name for o in r.outputs],
            "outputs": {o.name: enc(o.as_numpy()) for o in r.outputs},
        }

    async with InferenceGRPCClient(url) as client:
        res: dict[str, Any] = {
            "live": await client.is_server_live(),
            "ready": await client.is_server_ready(),
            "model_ready": await client.is_model_ready("digits", headers=auth),
        }
        r = await client.infer(request("digits", inputs["digits"], False, request_id="k-1"), headers=auth)
        res["digits"] = {"id": r.id, **result(r)}
        res["digits_typed"] = result(
            await client.infer(request("digits", inputs["digits"], True), headers=auth)
        )
        subset = [RequestedOutput("zneg"), RequestedOutput("mask")]
        res["multi_subset"] = result(
            await client.infer(request("multi", inputs["multi"], True, request_outputs=subset))
        )
        res["multi_raw"] = result(await client.infer(request("multi", inputs["multi"], False)))
        res["strings"] = result(await client.infer(request("strings", inputs["strings"], True)))
        try:
            await client.infer(
                request("digits", inputs["digits"], False), headers=(("authorization", "wrong"),)
            )
            res["wrong_token"] = None
        except Exception as exc:  # grpc.aio.AioRpcError
            res["wrong_token"] = str(exc.code())  # type: ignore[attr-defined]
    return res


def main() -> None:
    which = sys.argv[1]
    doc = json.load(sys.stdin)
    inputs = {model: {name: dec(t) for name, t in arrays.items()} for model, arrays in doc["inputs"].items()}
    if which == "triton":
        res = triton(doc["url"], doc["token"], inputs)
    else:
        res = asyncio.run(kserve(doc["url"], doc["token"], inputs))
    json.dump(res, sys.stdout)


if __name__ == "__main__":
    main()
