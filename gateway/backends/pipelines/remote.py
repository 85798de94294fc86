"""A model step whose predictor is another server, by URL: KServe's transformer in front of
``--predictor_host``, over V1 REST, V2 REST (JSON tensors) or V2 gRPC.

The step's feeds go out as the protocol's inputs and its outputs come back as arrays by
name, like any model step's. Each attempt is limited by the predictor's ``timeout_ms`` (or
what is left of the call's budget); a failure to connect and a 502, 503 or 504 of the
predictor are tried again ``retries`` times. What cannot be had ends the step: 504 when the
predictor did not answer in time, 502 otherwise, each naming the predictor and what it said.
The token goes in ``Authorization`` and is never part of a message.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import numpy as np

from gateway.backends.pipelines.runner import CallContext, StepFailed
from gateway.codecs import v2_tensors
from gateway.config.pipelines import PredictorSpec

_RETRY_STATUSES = frozenset({502, 503, 504})


class _Failed(Exception):
    def __init__(self, status: int, message: str, retry: bool) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry = retry


def _json_tensor(name: str, arr: np.ndarray) -> dict[str, Any]:
    datatype = v2_tensors.datatype_of(arr)
    if datatype == "BYTES":
        items = arr.ravel().tolist()
        data: list[Any] = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in items]
    else:
        data = (arr.astype(np.float32) if arr.dtype == np.float16 else arr).ravel().tolist()
    return {"name": name, "shape": list(arr.shape), "datatype": datatype, "data": data}


def _from_json(t: Mapping[str, Any]) -> np.ndarray:
    datatype, shape, data = t["datatype"], t["shape"], t["data"]
    if datatype == "BYTES":
        arr = np.empty(len(data), dtype=object)
        arr[:] = [d.encode() if isinstance(d, str) else d for d in data]
    else:
        arr = np.asarray(data, dtype=v2_tensors.DATATYPES[datatype])
    return arr.reshape(shape)


class RemoteModelCall:
    """A ``ModelRunner`` that calls a predictor on another server (see the module text)."""

    def __init__(self, step: str, spec: PredictorSpec, wanted: Sequence[str] = ()) -> None:
        self.step = step
        self.spec = spec
        self.wanted = tuple(wanted)
        self.headers = {"Content-Type": "application/json"}
        if spec.token:
            self.headers["Authorization"] = f"Bearer {spec.token}"
        self._session: aiohttp.ClientSession | None = None
        self._channel: Any = None

    async def __call__(self, feeds: Mapping[str, Any], ctx: CallContext) -> dict[str, np.ndarray]:
        spec = self.spec
        arrays = {name: np.asarray(value) for name, value in feeds.items()}
        last: _Failed | None = None
        for _ in range(spec.retries + 1):
            remaining = ctx.deadline - time.monotonic()
            if remaining <= 0:
                break
            limit = min(remaining, spec.timeout_ms / 1000.0) if spec.timeout_ms else remaining
            try:
                async with asyncio.timeout(limit):
                    return await self._once(arrays)
            except TimeoutError:
                last = _Failed(504, f"no answer within {limit * 1000:.0f} ms", True)
            except _Failed as exc:
                last = exc
            if not last.retry:
                break
        if last is None:
            message = f"the request's time ran out before {spec.label}"
            raise StepFailed(self.step, 504, message, "UpstreamTimeout")
        code = "UpstreamTimeout" if last.status == 504 else "PredictorFailed"
        raise StepFailed(self.step, last.status, f"{spec.label}: {last.message}", code)

    async def _once(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.spec.protocol == "grpc":
            return await self._grpc(arrays)
        if self._session is None:
            self._session = aiohttp.ClientSession()
        if self.spec.protocol == "v1":
            return await self._v1(arrays)
        return await self._v2(arrays)

    async def _post(self, url: str, doc: Any) -> Any:
        assert self._session is not None
        try:
            async with self._session.post(url, data=json.dumps(doc), headers=self.headers) as resp:
                text = await resp.text()
                status = resp.status
        except aiohttp.ClientConnectionError as exc:
            raise _Failed(502, f"cannot reach it ({type(exc).__name__}: {exc})", True) from None
        if status != 200:
            try:
                said = json.loads(text).get("error") or text
            except (ValueError, AttributeError):
                said = text
            status_out = 504 if status == 504 else 502
            raise _Failed(status_out, f"answered {status}: {str(said)[:300]}", status in _RETRY_STATUSES)
        try:
            return json.loads(text)
        except ValueError:
            raise _Failed(502, "its answer is not JSON", False) from None

    async def _v2(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        doc: dict[str, Any] = {"inputs": [_json_tensor(n, a) for n, a in arrays.items()]}
        if self.wanted:
            doc["outputs"] = [{"name": n} for n in self.wanted]
        answer = await self._post(f"{self.spec.url}/v2/models/{self.spec.model}/infer", doc)
        try:
            return {t["name"]: _from_json(t) for t in answer["outputs"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise _Failed(502, f"its answer is not a V2 inference answer ({exc})", False) from None

    async def _v1(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if len(arrays) == 1:
            instances: list[Any] = next(iter(arrays.values())).tolist()
        else:
            rows = {n: a.tolist() for n, a in arrays.items()}
            count = min(len(r) for r in rows.values())
            instances = [{n: r[i] for n, r in rows.items()} for i in range(count)]
        url = f"{self.spec.url}/v1/models/{self.spec.model}:predict"
        answer = await self._post(url, {"instances": instances})
        try:
            predictions = answer["predictions"]
            if predictions and isinstance(predictions[0], Mapping):
                return {n: np.asarray([p[n] for p in predictions]) for n in predictions[0]}
            if len(self.wanted) != 1:
                raise ValueError("the predictions name no outputs; the step must want exactly one")
            return {self.wanted[0]: np.asarray(predictions)}
        except (KeyError, TypeError, ValueError) as exc:
            raise _Failed(502, f"its answer is not a V1 prediction ({exc})", False) from None

    async def _grpc(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import grpc

        from gateway._proto import grpc_service_pb2 as pb
        from gateway._proto import grpc_service_pb2_grpc as pb_grpc

        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.spec.url.removeprefix("grpc://"))
        req = pb.ModelInferRequest(model_name=self.spec.model)
        for name, arr in arrays.items():
            req.inputs.add(name=name, datatype=v2_tensors.datatype_of(arr), shape=list(arr.shape))
            req.raw_input_contents.append(bytes(v2_tensors.to_raw(arr)))
        for name in self.wanted:
            req.outputs.add(name=name)
        metadata = (("authorization", self.headers["Authorization"]),) if self.spec.token else ()
        try:
            resp = await pb_grpc.GRPCInferenceServiceStub(self._channel).ModelInfer(req, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            status = 504 if code == grpc.StatusCode.DEADLINE_EXCEEDED else 502
            retry = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            raise _Failed(status, f"answered {code.name}: {exc.details()}", retry) from None
        try:
            return {
                out.name: v2_tensors.from_raw(raw, out.datatype, list(out.shape), f"output {out.name!r}")
                for out, raw in zip(resp.outputs, resp.raw_output_contents, strict=True)
            }
        except (ValueError, KeyError) as exc:
            raise _Failed(502, f"its answer's tensors cannot be read ({exc})", False) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


__all__ = ["RemoteModelCall"]
