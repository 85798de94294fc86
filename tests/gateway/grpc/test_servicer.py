"""The gRPC endpoint in process, over fake worker pools: lookups, tokens, status codes,
limits and the lifecycle. Inference against real workers and real clients is in
tests/e2e/test_grpc_e2e.py."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from gateway._proto import grpc_service_pb2 as pb
from gateway._proto import grpc_service_pb2_grpc as pb_grpc
from gateway.core.metadata import ModelMetadata, TensorSpec
from gateway.fronts.state import GATEWAY_KEY
from tests.gateway.front.fakes import TOKEN, Live, live_gateway

META = ModelMetadata(
    (TensorSpec("input", "FP32", (-1, 64)),), (TensorSpec("label", "INT64", (-1,)),), "onnxruntime_onnx"
)
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def live() -> AsyncIterator[tuple[Live, pb_grpc.GRPCInferenceServiceStub]]:
    port = free_port()
    async with live_gateway(grpc_port=port, max_body_bytes=1 << 16) as gw:
        gw.pools["digits"].metadata = META  # type: ignore[attr-defined]
        gw.pools["echo"].metadata = ModelMetadata()  # type: ignore[attr-defined]  # declares no tensors
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield gw, pb_grpc.GRPCInferenceServiceStub(channel)


def infer_request(model: str = "digits", rows: int = 1) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model)
    req.inputs.add(name="input", datatype="FP32", shape=[rows, 64])
    req.raw_input_contents.append(np.zeros((rows, 64), np.float32).tobytes())
    return req


async def test_health_metadata_and_index(live: tuple[Live, pb_grpc.GRPCInferenceServiceStub]) -> None:
    gw, stub = live
    assert (await stub.ServerLive(pb.ServerLiveRequest())).live
    assert (await stub.ServerReady(pb.ServerReadyRequest())).ready
    meta = await stub.ServerMetadata(pb.ServerMetadataRequest())
    assert meta.name == "easkit-gateway" and meta.version
    md = await stub.ModelMetadata(pb.ModelMetadataRequest(name="digits"), metadata=AUTH)
    assert (md.name, list(md.versions), md.platform) == ("digits", ["1"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == [("input", "FP32", [-1, 64])]
    index = await stub.RepositoryIndex(pb.RepositoryIndexRequest())
    assert [(m.name, m.version, m.state) for m in index.models] == [("digits", "1", "READY")]  # onnx only
    gw.pools["digits"].ready = False
    assert not (await stub.ServerReady(pb.ServerReadyRequest())).ready
    assert not (await stub.ModelReady(pb.ModelReadyRequest(name="digits"), metadata=AUTH)).ready
    index = await stub.RepositoryIndex(pb.RepositoryIndexRequest())
    assert [(m.state, m.reason) for m in index.models] == [("UNAVAILABLE", "it has no ready worker")]
    assert not (await stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))).models


async def test_lookups_and_tokens(live: tuple[Live, pb_grpc.GRPCInferenceServiceStub]) -> None:
    gw, stub = live
    for metadata in ((("authorization", TOKEN),), AUTH):  # plain or Bearer
        assert (await stub.ModelReady(pb.ModelReadyRequest(name="digits"), metadata=metadata)).ready
    cases = [
        (stub.ModelReady(pb.ModelReadyRequest(name="digits")), grpc.StatusCode.UNAUTHENTICATED),
        (stub.ModelReady(pb.ModelReadyRequest(name="digits"), metadata=(("authorization", "Bearer nope"),)),
         grpc.StatusCode.UNAUTHENTICATED),
        (stub.ModelMetadata(pb.ModelMetadataRequest(name="nosuch")), grpc.StatusCode.NOT_FOUND),
        (stub.ModelMetadata(pb.ModelMetadataRequest(name="echo")), grpc.StatusCode.NOT_FOUND),  # no tensors
        (stub.ModelMetadata(pb.ModelMetadataRequest(name="../x")), grpc.StatusCode.INVALID_ARGUMENT),
        (stub.ModelConfig(pb.ModelConfigRequest(name="digits", version="2"), metadata=AUTH),
         grpc.StatusCode.NOT_FOUND),
        (stub.ModelInfer(infer_request("nosuch")), grpc.StatusCode.NOT_FOUND),
        (stub.ModelInfer(infer_request()), grpc.StatusCode.UNAUTHENTICATED),
        # Model control is off without an admin token in the config.
        (stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="digits")),
         grpc.StatusCode.PERMISSION_DENIED),
        (stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="digits")),
         grpc.StatusCode.PERMISSION_DENIED),
    ]  # fmt: skip
    for call, code in cases:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() is code, info.value.details()
    assert not gw.pools["digits"].calls  # nothing refused reached a worker
    # The names no service has (nosuch twice, ../x) are counted, never labelled.
    assert gw.app[GATEWAY_KEY].metrics.unknown_service.value == 3
    # Statistics without a name: only the models whose token the caller holds.
    assert [s.name for s in (await stub.ModelStatistics(pb.ModelStatisticsRequest())).model_stats] == []
    stats = await stub.ModelStatistics(pb.ModelStatisticsRequest(), metadata=AUTH)
    assert [s.name for s in stats.model_stats] == ["digits"]


@pytest.mark.parametrize(
    ("mode", "code", "retry_after"),
    [
        ("overloaded", grpc.StatusCode.RESOURCE_EXHAUSTED, "1"),
        ("noready", grpc.StatusCode.UNAVAILABLE, "1"),
        ("timeout", grpc.StatusCode.DEADLINE_EXCEEDED, None),
        ("crash", grpc.StatusCode.INTERNAL, None),
    ],
)
async def test_dispatch_failures_map_to_grpc_codes(
    live: tuple[Live, pb_grpc.GRPCInferenceServiceStub],
    mode: str,
    code: grpc.StatusCode,
    retry_after: str | None,
) -> None:
    gw, stub = live
    gw.pools["digits"].mode = mode
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(infer_request(), metadata=AUTH)
    err = info.value
    trailing = dict(err.trailing_metadata() or ())
    assert err.code() is code and "secret" not in (err.details() or "")
    assert len(trailing["x-request-id"]) == 32
    assert trailing.get("retry-after") == retry_after
    # The call counts in the gateway's metrics under the service's name.
    status = {"overloaded": 450, "noready": 503, "timeout": 504, "crash": 500}[mode]
    assert gw.app[GATEWAY_KEY].metrics.requests.counts[("digits", status)] == 1


async def test_deadline_bounds_the_dispatch_and_body_limit(
    live: tuple[Live, pb_grpc.GRPCInferenceServiceStub],
) -> None:
    gw, stub = live
    gw.pools["digits"].mode = "timeout"
    sent = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.ModelInfer(infer_request(), metadata=AUTH, timeout=1.5)
    took = time.monotonic() - sent
    ((_, timeout),) = gw.pools["digits"].calls
    # The client's deadline (sent rounded up), less what the call spent before the dispatch
    # (at most all it took, however slow the machine); not the service's 5 s.
    assert 1.5 - took <= timeout <= 1.6
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(infer_request(), metadata=AUTH, timeout=0.005)
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    # A message over the gateway's body limit (64 KiB here) is refused by gRPC unread.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(infer_request(rows=300), metadata=AUTH)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(gw.pools["digits"].calls) == 1


async def test_access_lines_name_the_call_never_the_token(
    live: tuple[Live, pb_grpc.GRPCInferenceServiceStub], caplog: pytest.LogCaptureFixture
) -> None:
    gw, stub = live
    gw.pools["digits"].mode = "overloaded"
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        assert (await stub.ServerLive(pb.ServerLiveRequest(), metadata=AUTH)).live
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.ModelInfer(infer_request(), metadata=AUTH)
    lines = [r for r in caplog.records if r.name == "gateway.access"]
    assert [(r.method, r.path, r.status, r.remote) for r in lines] == [  # type: ignore[attr-defined]
        ("GRPC", "/inference.GRPCInferenceService/ServerLive", 200, "127.0.0.1"),
        ("GRPC", "/inference.GRPCInferenceService/ModelInfer", 450, "127.0.0.1"),
    ]
    assert all(len(r.request_id) == 32 for r in lines)  # type: ignore[attr-defined]
    assert TOKEN not in caplog.text
