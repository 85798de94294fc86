"""Dynamic batching in onnx workers (``batching.max_batch_size``), with real worker processes.

The test model (built here) computes per row ``y = 2x`` and ``s = sum(x, axis 1)`` for
``x`` float32[N,D]; a Loop of ``max(x)`` iterations lets one request hold the compute
thread until it is cancelled (ONNX Runtime's terminate flag), so the requests sent
meanwhile are queued in the worker and the batches they form are known exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eas_sdk._proto import blade_pb2, tf_predict_pb2, torch_predict_pb2
from gateway.backends.pool import WorkerPool
from gateway.config import BatchingConfig, ServiceConfig
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.core.errors import GatewayError
from gateway.worker.processors.onnx import OnnxProcessor

MakePool = Callable[..., Any]
ROOT = Path(__file__).resolve().parents[3]
BLOCK = 1e9  # loop iterations of the blocking request: it only ends by being cancelled


def _build_model(path: Path) -> Path:
    from onnx import TensorProto, helper

    sys.path.insert(0, str(ROOT / "samples"))
    try:
        from build_models import spin_loop_body
    finally:
        sys.path.remove(str(ROOT / "samples"))
    body = spin_loop_body()
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
        helper.make_node("Cast", ["mx"], ["n"], to=TensorProto.INT64),
        helper.make_node("Loop", ["n", "cond", "v0"], ["count"], body=body),
        helper.make_node("Mul", ["count", "zero"], ["nothing"]),
        helper.make_node("Mul", ["x", "two"], ["x2"]),
        helper.make_node("Add", ["x2", "nothing"], ["y"]),
        helper.make_node("ReduceSum", ["x", "axis1"], ["s"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "batchtest",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "D"])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "D"]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N"]),
        ],
        [
            helper.make_tensor("cond", TensorProto.BOOL, [], [True]),
            helper.make_tensor("v0", TensorProto.FLOAT, [1], [0.0]),
            helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_model(tmp_path_factory.mktemp("batching") / "batchtest.onnx")


def _service(model: Path, max_batch: int = 0, wait_ms: float = 0.0, name: str = "bt") -> ServiceConfig:
    return ServiceConfig(
        name=name,
        processor="onnx",
        model=str(model),
        workers=1,
        max_pending=256,
        batching=BatchingConfig(max_batch_size=max_batch, max_latency_ms=wait_ms),
    )


def _tf(x: np.ndarray, outputs: tuple[str, ...] = (), dtype: int = tf_predict_pb2.DT_FLOAT) -> bytes:
    req = tf_predict_pb2.PredictRequest(signature_name="predict")
    req.inputs["x"].dtype = dtype
    req.inputs["x"].array_shape.dim.extend(x.shape)
    if dtype == tf_predict_pb2.DT_FLOAT:
        req.inputs["x"].float_val.extend(x.ravel().tolist())
    else:
        req.inputs["x"].int64_val.extend(int(v) for v in x.ravel())
    req.output_filter.extend(outputs)
    return req.SerializeToString()


def _torch(x: np.ndarray) -> bytes:
    req = torch_predict_pb2.PredictRequest()
    a = req.inputs.add()
    a.dtype = torch_predict_pb2.DT_FLOAT
    a.array_shape.dim.extend(x.shape)
    a.float_val.extend(x.ravel().tolist())
    req.output_filter.extend([1, 0])  # s, then y
    return req.SerializeToString()


def _blade(x: np.ndarray) -> bytes:
    req = blade_pb2.Request(tf_signature_name="s")
    a = req.inputs.add(name_in_dl_model="x", blade_blob_name="x", batchsize=x.shape[0])
    a.shape.dim.extend(x.shape)
    a.float_val.extend(x.ravel().tolist())
    req.output_info.add(name_in_dl_model="y", data_type=blade_pb2.DT_FLOAT)
    return req.SerializeToString()


def _json(x: np.ndarray) -> bytes:
    return json.dumps({"inputs": {"x": x.tolist()}}).encode()


def _outputs(resp: WorkerResponse) -> dict[str, np.ndarray]:
    assert resp.status == 200, resp.body[:300]
    if resp.content_type == "application/json":
        outs = json.loads(resp.body)["outputs"]
        return {k: np.array(v["data"], np.float32).reshape(v["shape"]) for k, v in outs.items()}
    pb = tf_predict_pb2.PredictResponse.FromString(resp.body)
    return {
        k: np.array(v.float_val, np.float32).reshape(list(v.array_shape.dim)) for k, v in pb.outputs.items()
    }


def _check(resp: WorkerResponse, x: np.ndarray, outputs: tuple[str, ...] = ("y", "s")) -> None:
    got = _outputs(resp)
    assert sorted(got) == sorted(outputs)
    if "y" in outputs:
        np.testing.assert_array_equal(got["y"], x * 2)
    if "s" in outputs:
        np.testing.assert_allclose(got["s"], x.sum(axis=1), rtol=1e-6)


async def _wait_outstanding(pool: WorkerPool, n: int) -> dict[str, Any]:
    """Bounded poll until the worker holds ``n`` requests (queued or running)."""
    stats: dict[str, Any] = {}
    for _ in range(200):
        stats = await pool.worker_stats(0)
        if stats["outstanding"] >= n:
            return stats
        await asyncio.sleep(0.02)
    raise AssertionError(f"worker never held {n} requests: {stats}")


async def _block(pool: WorkerPool) -> asyncio.Task[WorkerResponse]:
    """Occupy the worker's compute thread with a request that runs until cancelled."""
    task = asyncio.create_task(pool.dispatch(WorkerRequest(_tf(np.full((1, 4), BLOCK, np.float32))), 30))
    for _ in range(200):
        if (await pool.worker_stats(0))["runs"] >= 1:
            return task
        await asyncio.sleep(0.02)
    raise AssertionError("the blocking request never started")


async def _unblock(task: asyncio.Task[WorkerResponse]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _rows(rng: np.random.Generator, n: int, d: int = 4) -> np.ndarray:
    return rng.integers(0, 5, size=(n, d)).astype(np.float32) / 4


async def test_batched_answers_equal_unbatched_for_many_callers(make_pool: MakePool, model: Path) -> None:
    """40 concurrent callers, 1-6 rows each, TF, JSON, Torch and Blade bodies: a batched
    service answers each exactly (byte for byte) as an unbatched one does; batching is off
    by default."""
    batched = await make_pool(_service(model, max_batch=16, name="on"))
    plain = await make_pool(_service(model, name="off"))
    rng = np.random.default_rng(1)
    inputs = [_rows(rng, int(rng.integers(1, 7))) for _ in range(40)]
    encoders = (_tf, _json, _tf, _torch, _tf, _blade)
    bodies = [encoders[i % len(encoders)](x) for i, x in enumerate(inputs)]

    async def run_all(pool: WorkerPool) -> list[WorkerResponse]:
        blocker = await _block(pool)
        calls = [
            asyncio.create_task(pool.dispatch(WorkerRequest(b, request_id=f"r{i}"), 30))
            for i, b in enumerate(bodies)
        ]
        await _wait_outstanding(pool, 1 + len(bodies))
        await _unblock(blocker)
        return await asyncio.gather(*calls)

    on = await run_all(batched)
    off = await run_all(plain)
    for i, (x, a, b) in enumerate(zip(inputs, on, off, strict=True)):
        assert (a.status, a.content_type, a.body) == (b.status, b.content_type, b.body)
        kind = encoders[i % len(encoders)]
        if kind is _torch:
            pb = torch_predict_pb2.PredictResponse.FromString(a.body)
            np.testing.assert_allclose(pb.outputs[0].float_val, x.sum(axis=1), rtol=1e-6)
            np.testing.assert_array_equal(np.reshape(pb.outputs[1].float_val, x.shape), x * 2)
        elif kind is _blade:
            out = blade_pb2.Response.FromString(a.body).outputs
            assert [o.name_in_dl_model for o in out] == ["y"] and out[0].batchsize == len(x)
            np.testing.assert_array_equal(np.reshape(out[0].float_val, x.shape), x * 2)
        else:
            _check(a, x)
    s_on, s_off = await batched.worker_stats(0), await plain.worker_stats(0)
    assert s_off["batches"] == 0 and s_off["batched"] == 0 and s_off["runs"] == 41
    # Each format is its own family; within each, batches of <= 16 rows.
    # (a request that fits no batch's remaining rows may run alone)
    assert s_on["runs"] == 41 and s_on["batched"] >= 30
    assert 2 <= s_on["batches"] < 40 // 2


async def test_mixed_requests_bad_one_and_cancelled_one(make_pool: MakePool, model: Path) -> None:
    """Only compatible requests share a run (same format, same trailing dims, same outputs,
    <= max_batch_size rows); a bad request in the middle gets its own 400 and a request
    whose deadline passed while queued is dropped, while the others are answered."""
    pool = await make_pool(_service(model, max_batch=4))
    rng = np.random.default_rng(2)
    a, f, k = _rows(rng, 2), _rows(rng, 1), _rows(rng, 3)  # D=4: a+f batch; k does not fit
    b, h = _rows(rng, 1, 8), _rows(rng, 2, 8)  # D=8: b+h batch
    c, e, g = _rows(rng, 1), _rows(rng, 2), _rows(rng, 1)
    blocker = await _block(pool)

    def send(body: bytes, timeout: float = 30) -> asyncio.Task[WorkerResponse]:
        return asyncio.create_task(pool.dispatch(WorkerRequest(body), timeout))

    calls = {
        "a": send(_tf(a)),
        "b": send(_tf(b)),
        "c": send(_json(c)),  # another format family
        "bad": send(_tf(np.ones((1, 4)), dtype=tf_predict_pb2.DT_INT64)),  # int64 for a float input
        "e": send(_tf(e, outputs=("s",))),  # another output selection
        "g": send(_tf(g), timeout=1.0),  # expires while queued (the blocker runs until it has)
        "f": send(_tf(f)),
        "k": send(_tf(k)),
        "h": send(_tf(h)),
    }
    await _wait_outstanding(pool, 1 + len(calls))
    with pytest.raises(GatewayError) as info:
        await calls.pop("g")
    assert info.value.status == 504  # its deadline, which the worker checks too, has passed
    await _unblock(blocker)
    got = {name: await task for name, task in calls.items()}
    for name, x in (("a", a), ("b", b), ("c", c), ("f", f), ("k", k), ("h", h)):
        _check(got[name], x)
    _check(got["e"], e, outputs=("s",))
    assert got["bad"].status == 400
    assert "expected float32[N,D], got int64[1,4]" in json.loads(got["bad"].body)["message"]
    stats = await pool.worker_stats(0)
    assert stats["dropped"] == 1
    assert (stats["batches"], stats["batched"]) == (2, 4)  # {a, f} and {b, h}
    assert stats["runs"] == 1 + 7  # blocker, a f b h c e k (bad failed before running)


async def test_cancelled_member_does_not_stop_its_batch(make_pool: MakePool, model: Path) -> None:
    """A request cancelled while its batch runs is answered no more; the others still are."""
    pool = await make_pool(_service(model, max_batch=8))
    rng = np.random.default_rng(3)
    blocker = await _block(pool)
    slow = np.full((1, 4), 300_000, np.float32)  # ~0.3 s of loop for the whole batch
    xs = [_rows(rng, 2), slow, _rows(rng, 1)]
    calls = [asyncio.create_task(pool.dispatch(WorkerRequest(_tf(x)), 30)) for x in xs]
    await _wait_outstanding(pool, 4)
    await _unblock(blocker)
    for _ in range(200):  # the batch of three is running
        if (await pool.worker_stats(0))["batches"] == 1:
            break
        await asyncio.sleep(0.01)
    calls[0].cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await calls[0]
    _check(await calls[1], slow)
    _check(await calls[2], xs[2])
    stats = await pool.worker_stats(0)
    assert (stats["batches"], stats["batched"], stats["dropped"]) == (1, 3, 0)


async def test_waiting_policy_answers_every_request(make_pool: MakePool, model: Path) -> None:
    """max_latency_ms > 0: requests arriving within the window share runs; all answered right."""
    pool = await make_pool(_service(model, max_batch=32, wait_ms=50))
    rng = np.random.default_rng(4)
    xs = [_rows(rng, int(rng.integers(1, 4))) for _ in range(12)]
    resps = await asyncio.gather(*(pool.dispatch(WorkerRequest(_tf(x)), 30) for x in xs))
    for x, r in zip(xs, resps, strict=True):
        _check(r, x)
    assert (await pool.worker_stats(0))["runs"] == 12


def test_only_dynamic_first_dimension_models_batch(models: dict[str, Path], model: Path) -> None:
    def proc(path: Path, max_batch: int) -> OnnxProcessor:
        batching = BatchingConfig(max_batch)
        p = OnnxProcessor(ServiceConfig(name="m", processor="onnx", model=str(path), batching=batching))
        p.load()
        return p

    assert proc(model, 8).supports_batching
    assert proc(models["digits"], 8).supports_batching
    assert not proc(models["digits"], 0).supports_batching  # off by default
    assert not proc(models["digits"], 1).supports_batching
    assert not proc(models["spin"], 8).supports_batching  # scalar input, fixed [1] output
    p = proc(model, 8)
    one = p.prepare(WorkerRequest(_tf(np.ones((3, 4), np.float32))))
    other = p.prepare(WorkerRequest(_tf(np.ones((2, 5), np.float32))))
    assert one.rows == 3 and one.key is not None and one.key != other.key
    out = p.process_batch([one, p.prepare(WorkerRequest(_tf(np.zeros((1, 4), np.float32))))])
    assert all(isinstance(r, WorkerResponse) for r in out)
    _check(out[0], np.ones((3, 4), np.float32))  # type: ignore[arg-type]
    _check(out[1], np.zeros((1, 4), np.float32))  # type: ignore[arg-type]
