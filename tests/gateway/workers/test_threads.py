"""An onnx service run in the gateway's threads (``placement: thread``), through the dataplane:
real ONNX Runtime sessions on the sample models, no worker processes."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.app import _default_pool_factory
from gateway.backends.pool import WorkerPool
from gateway.backends.threads import ThreadService
from gateway.config import BatchingConfig, ServiceConfig
from gateway.core import errors
from gateway.core.dataplane import JSON_FORM_HEADERS, DataPlane
from tests.gateway.workers.conftest import fast_gateway
from tests.waiting import async_wait_until

X = np.arange(64, dtype=np.float32).reshape(1, 64) / 4.0


async def _tensors(
    plane: DataPlane,
    svc: ServiceConfig,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str] = (),
    *,
    request_id: str,
    timeout: float,
) -> dict[str, np.ndarray]:
    """A V2 call's arrays into the core, as the gRPC adapter makes it (``timeout``: its deadline)."""

    async def decode(_: bytes) -> tuple[None, Mapping[str, np.ndarray], Sequence[str]]:
        return None, inputs, outputs

    _, out = await plane.tensors_call(
        svc, {}, "", None, decode, request_id=request_id, arrived=time.monotonic(), deadline=timeout
    )
    return out


async def _json_form(
    plane: DataPlane, svc: ServiceConfig, body: bytes, *, request_id: str
) -> tuple[int, bytes]:
    """A call in the onnx processor's JSON form: (status, body)."""
    resp = await plane.record_call(svc, JSON_FORM_HEADERS, body, request_id=request_id)
    return resp.status, bytes(resp.body)


def _service(model: Path, **kw: Any) -> ServiceConfig:
    base: dict[str, Any] = {
        "name": "digits",
        "processor": "onnx",
        "model": str(model),
        "public": True,
        "placement": "thread",
    }
    base.update(kw)
    return ServiceConfig(**base)


async def _started(svc: ServiceConfig) -> ThreadService:
    backend = ThreadService(svc, fast_gateway())
    await backend.start()
    return backend


@pytest.fixture
async def digits(models: dict[str, Path]) -> AsyncIterator[tuple[DataPlane, ThreadService]]:
    svc = _service(models["digits"])
    backend = await _started(svc)
    assert await backend.wait_ready(30.0)
    yield DataPlane([svc], {svc.name: backend}), backend
    await backend.stop(1.0)


def test_the_default_factory_follows_the_placement(models: dict[str, Path]) -> None:
    svc = _service(models["digits"])
    assert isinstance(_default_pool_factory(svc, fast_gateway()), ThreadService)
    pool = _default_pool_factory(_service(models["digits"], placement="process"), fast_gateway())
    assert isinstance(pool, WorkerPool)


async def test_tensors_go_in_and_come_out_as_arrays(digits: tuple[DataPlane, ThreadService]) -> None:
    plane, backend = digits
    svc = plane.services["digits"]
    out = await _tensors(plane, svc, {"input": X}, ["probabilities"], request_id="r1", timeout=5.0)
    assert list(out) == ["probabilities"]
    assert out["probabilities"].shape == (1, 10)
    assert out["probabilities"].dtype == np.float32
    # The same call in the EAS JSON form gives the same numbers.
    body = json.dumps({"inputs": {"input": X.tolist()}, "outputs": ["probabilities"]}).encode()
    status, reply = await _json_form(plane, svc, body, request_id="r2")
    assert status == 200
    got = json.loads(reply)["outputs"]["probabilities"]
    np.testing.assert_allclose(np.asarray(got["data"], dtype=np.float32).reshape(1, 10), out["probabilities"])
    assert plane.stats["digits"].success_count == 2
    assert backend.metadata is not None and [t.name for t in backend.metadata.inputs] == ["input"]
    [session] = backend.snapshot()
    assert session["state"] == "ready" and session["pid"] == os.getpid() and session["runs"] == 2


async def test_a_bad_input_is_refused_as_the_worker_refuses_it(
    digits: tuple[DataPlane, ThreadService],
) -> None:
    plane, _ = digits
    svc = plane.services["digits"]
    with pytest.raises(errors.ProcessorFailed) as info:
        await _tensors(plane, svc, {"input": X[:, :10]}, request_id="r", timeout=5.0)
    assert info.value.status == 400 and "expected float32[N,64]" in info.value.message
    with pytest.raises(errors.ProcessorFailed, match="unknown output 'nope'"):
        await _tensors(plane, svc, {"input": X}, ["nope"], request_id="r", timeout=5.0)


async def test_the_pending_limit_and_a_stopped_service(models: dict[str, Path]) -> None:
    svc = _service(models["digits"], max_pending=1, workers=2)
    backend = await _started(svc)
    assert await backend.wait_all_ready(30.0)
    plane = DataPlane([svc], {svc.name: backend})
    # Calls beyond the pending limit are refused with 450; those admitted are all answered.
    calls = [_tensors(plane, svc, {"input": X}, request_id=str(i), timeout=5.0) for i in range(8)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    answered = [r for r in results if isinstance(r, dict)]
    refused = [r for r in results if isinstance(r, errors.GatewayError)]
    assert answered and len(answered) + len(refused) == 8
    assert all(r.status == 450 for r in refused)
    await backend.stop(1.0)
    assert not backend.is_ready() and backend.not_ready_reason() == "the service is stopping"
    with pytest.raises(errors.ServiceNotReady):
        await _tensors(plane, svc, {"input": X}, request_id="late", timeout=5.0)


async def test_a_model_that_does_not_load_is_not_ready_with_the_reason(tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    svc = _service(broken)
    backend = await _started(svc)
    assert not await backend.wait_ready(30.0)
    assert not backend.is_ready()
    reason = backend.not_ready_reason()
    assert reason is not None and reason.startswith("its model failed to load:")
    assert str(tmp_path) not in reason  # directories are not shown to clients
    plane = DataPlane([svc], {svc.name: backend})
    with pytest.raises(errors.ServiceNotReady, match="failed to load"):
        await _tensors(plane, svc, {"input": X}, request_id="r", timeout=5.0)
    await backend.stop(0.0)


async def test_scaling_adds_and_drains_sessions(models: dict[str, Path]) -> None:
    backend = await _started(_service(models["digits"]))
    assert await backend.wait_all_ready(30.0)
    await backend.scale(3, 1.0)
    assert await backend.wait_all_ready(30.0)
    assert [s["state"] for s in backend.snapshot()] == ["ready"] * 3
    await backend.scale(1, 1.0)
    assert [s["id"] for s in backend.snapshot()] == [0]
    assert backend.ready_endpoints() == []  # no direct mode: nothing to discover
    await backend.stop(1.0)


async def test_a_call_past_its_timeout_is_answered_504_and_never_runs(
    digits: tuple[DataPlane, ThreadService],
) -> None:
    plane, backend = digits
    svc = plane.services["digits"]
    [session] = backend._sessions
    queue = session.queue
    assert queue is not None
    # A run held on the compute thread until released: the next call queues behind it.
    release = threading.Event()
    handle = session.processor.handle

    def held(req: Any) -> Any:
        release.wait(10.0)
        return handle(req)

    queue.inline = False
    session.processor.handle = held  # type: ignore[method-assign]
    first = asyncio.ensure_future(_tensors(plane, svc, {"input": X}, request_id="held", timeout=10.0))
    await async_wait_until(lambda: queue.outstanding, 10, "the held call on the compute thread")
    with pytest.raises(errors.UpstreamTimeout):
        await _tensors(plane, svc, {"input": X}, request_id="late", timeout=0.05)
    release.set()
    assert (await first)["label"].shape == (1,)
    await queue.idle.wait()
    assert queue.dropped == 1 and queue.runs == 1  # the late call was dropped unrun


async def _inlined_of_calls(svc: ServiceConfig, calls: int) -> tuple[int, int]:
    """(calls run in the event loop, runs) after ``calls`` small calls to a fresh service."""
    body = json.dumps({"inputs": {"n": 10}}).encode()
    backend = await _started(svc)
    assert await backend.wait_ready(30.0)
    plane = DataPlane([svc], {svc.name: backend})
    for _ in range(calls):
        status, _ = await _json_form(plane, svc, body, request_id="r")
        assert status == 200
    [session] = backend._sessions
    queue = session.queue
    assert queue is not None
    await backend.stop(1.0)
    return queue.inlined, queue.runs


async def test_small_runs_stay_in_the_loop_and_a_slow_one_sends_the_next_to_the_thread(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = _service(models["spin"], name="spin")
    # Which runs count as small is a tuned bound, and whether a run stays under it depends on
    # the machine's load: the test sets the bounds so that every run is small (the watchdog's
    # hard budget too), then so that every run is too slow.
    monkeypatch.setattr("gateway.worker.compute.INLINE_BUDGET_S", 60.0)
    monkeypatch.setattr("gateway.backends.threads.INLINE_MAX_S", 60.0)
    assert await _inlined_of_calls(svc, 6) == (6, 6)
    # Every run too slow for the loop: after a few in a row (one alone may be the process
    # preempted), the calls after them go to the thread.
    monkeypatch.setattr("gateway.backends.threads.INLINE_MAX_S", 0.0)
    inlined, runs = await _inlined_of_calls(svc, 6)
    assert runs == 6 and 0 < inlined < 6


async def test_batched_tensor_calls_each_get_their_own_rows(models: dict[str, Path]) -> None:
    svc = _service(models["digits"], batching=BatchingConfig(max_batch_size=8, max_latency_ms=50.0))
    backend = await _started(svc)
    assert await backend.wait_ready(30.0)
    plane = DataPlane([svc], {svc.name: backend})
    rows = [np.full((1, 64), float(i), dtype=np.float32) for i in range(4)]
    try:
        alone = [await _tensors(plane, svc, {"input": x}, request_id="a", timeout=5.0) for x in rows]
        together = await asyncio.gather(
            *(_tensors(plane, svc, {"input": x}, request_id=str(i), timeout=5.0) for i, x in enumerate(rows))
        )
    finally:
        await backend.stop(1.0)
    for one, other in zip(alone, together, strict=True):
        assert one["probabilities"].shape == other["probabilities"].shape == (1, 10)
        np.testing.assert_allclose(one["probabilities"], other["probabilities"], rtol=1e-5)
        assert one["label"].tolist() == other["label"].tolist()
