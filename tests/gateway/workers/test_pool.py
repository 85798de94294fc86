"""WorkerPool with real spawned worker processes on 127.0.0.1: readiness, dispatch, retries,
restarts, timeouts and cancels, and direct-mode HTTP on a worker."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from eas_sdk._core.auth import signed_headers
from gateway.backends.pool import NoReadyWorker, PoolOverloaded, UpstreamTimeout, WorkerPool, WorkerState
from gateway.config import ServiceConfig
from gateway.core.calls import WorkerRequest
from gateway.core.metadata import ModelMetadata
from tests.gateway.workers.conftest import echo_service, fast_gateway

pytestmark = pytest.mark.timeout(60)

MakePool = Callable[..., Any]


async def _pid(pool: WorkerPool, timeout: float = 5.0) -> int:
    resp = await pool.dispatch(WorkerRequest(b"pid"), timeout)
    assert resp.status == 200, resp.body
    return int(resp.body)


async def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _until_worker_holds(pool: WorkerPool, n: int) -> None:
    """Until worker 0 holds ``n`` requests (running, queued or cancelled but not yet dropped)."""
    deadline = time.monotonic() + 10
    while (await pool.worker_stats(0))["outstanding"] < n:
        assert time.monotonic() < deadline, f"the worker never held {n} request(s)"
        await asyncio.sleep(0.01)


async def test_ready_snapshot_and_onnx_dispatch(make_pool: MakePool, models: dict[str, Path]) -> None:
    svc = ServiceConfig(name="digits", processor="onnx", model=str(models["digits"]), workers=2)
    pool = await make_pool(svc)
    await _until(lambda: len(pool.ready_endpoints()) == 2, 20, "both workers ready")
    snap = pool.snapshot()
    assert [w["state"] for w in snap] == ["ready", "ready"]
    assert all(w.state is WorkerState.READY for w in pool._workers)
    # The processor's metadata came with the workers' readiness.
    assert pool.metadata is not None and pool.metadata.platform == "onnxruntime_onnx"
    assert pool.metadata.inputs[0].as_json() == {"name": "input", "datatype": "FP32", "shape": [-1, 64]}
    assert all(w["pid"] and w["http_port"] for w in snap)
    assert sorted(p for _, p in pool.ready_endpoints()) == sorted(w["http_port"] for w in snap)
    body = json.dumps({"inputs": {"input": [[0.0] * 64]}, "outputs": ["label"]}).encode()
    resp = await pool.dispatch(WorkerRequest(body, request_id="r1"), 5)
    assert resp.status == 200 and resp.content_type == "application/json"
    assert json.loads(resp.body)["outputs"]["label"]["shape"] == [1]
    assert resp.compute_us > 0
    bad = await pool.dispatch(WorkerRequest(b'{"inputs": {"input": [[1.0, 2.0]]}}', request_id="r2"), 5)
    assert bad.status == 400
    err = json.loads(bad.body)
    assert err["message"] == "input 'input': expected float32[N,64], got float32[1,2]"
    assert err["request_id"] == "r2"
    # Random bytes are 400s and the worker stays up.
    pids = {w["pid"] for w in pool.snapshot()}
    rng = random.Random(5)
    for i in range(60):
        junk = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300)))
        resp = await pool.dispatch(WorkerRequest(junk), 5)
        assert resp.status == 400, (i, junk.hex(), resp.body)
    assert {w["pid"] for w in pool.snapshot()} == pids and pool.restarts_total == 0


async def test_least_outstanding_avoids_the_busy_worker(make_pool: MakePool) -> None:
    pool = await make_pool(echo_service(workers=2))
    await _until(lambda: len(pool.ready_endpoints()) == 2, 20, "both workers ready")
    pids = {w["pid"] for w in pool.snapshot()}
    slow = asyncio.create_task(pool.dispatch(WorkerRequest(b"sleep:1.0"), 5))
    await _until(lambda: any(w["outstanding"] for w in pool.snapshot()), 5, "slow request in flight")
    busy = next(w["pid"] for w in pool.snapshot() if w["outstanding"])
    seen = [await _pid(pool) for _ in range(10)]
    assert set(seen) == pids - {busy}
    assert (await slow).body == b"slept 1"


async def test_processor_exception_is_400_and_worker_survives(make_pool: MakePool) -> None:
    pool = await make_pool(echo_service(config={"k": [1, 2]}))
    assert pool.metadata == ModelMetadata()  # the echo class declares no metadata()
    pid = await _pid(pool)
    # The service's config mapping reaches the processor in the worker process.
    assert json.loads((await pool.dispatch(WorkerRequest(b"config"), 5)).body) == {"k": [1, 2]}
    resp = await pool.dispatch(WorkerRequest(b"raise:bad things"), 5)
    assert resp.status == 400
    assert json.loads(resp.body)["message"] == "bad things"
    resp = await pool.dispatch(WorkerRequest(b"status:418"), 5)
    assert (resp.status, resp.body) == (418, b"status 418")
    assert await _pid(pool) == pid
    assert pool.restarts_total == 0


async def test_kill_one_of_two_during_burst_loses_nothing(make_pool: MakePool) -> None:
    """In-flight requests on the killed worker are retried on the other one."""
    pool = await make_pool(echo_service(workers=2, max_pending=256))
    await _until(lambda: len(pool.ready_endpoints()) == 2, 20, "both workers ready")
    victim = pool.snapshot()[0]["pid"]
    results: list[int] = []
    failures: list[BaseException] = []
    stop = asyncio.Event()

    async def client() -> None:
        n = 0
        while not stop.is_set() and n < 5000:
            n += 1
            try:
                resp = await pool.dispatch(WorkerRequest(b"pid"), 5)
                assert resp.status == 200
                results.append(int(resp.body))
            except Exception as exc:
                failures.append(exc)

    async def killer() -> None:
        try:
            # Mid-burst: once the victim has answered some, and 100 answers more after that.
            await _until(lambda: results.count(victim) >= 20, 20, "the victim answering")
            os.kill(victim, signal.SIGKILL)
            after = len(results)
            await _until(lambda: len(results) >= after + 100, 20, "answers after the kill")
        finally:
            stop.set()

    await asyncio.gather(*(client() for _ in range(16)), killer())
    assert not failures, failures[:3]
    # The supervisor respawns the worker, and the new process takes traffic again.
    await _until(lambda: pool.snapshot()[0]["state"] == "ready", 20, "respawned worker ready")
    new_pid = pool.snapshot()[0]["pid"]
    assert new_pid != victim and pool.restarts_total == 1 and pool.snapshot()[0]["restarts"] == 1
    seen = {await _pid(pool) for _ in range(20)}
    assert new_pid in seen


async def test_all_workers_down_fails_fast_then_recovers(make_pool: MakePool) -> None:
    """No ready worker is answered at once (no hang), and service resumes after respawn."""
    pool = await make_pool(echo_service(workers=2))
    await _until(lambda: len(pool.ready_endpoints()) == 2, 20, "both workers ready")
    for w in pool.snapshot():
        os.kill(w["pid"], signal.SIGKILL)
    await _until(lambda: not pool.ready_endpoints(), 5, "workers out of routing")
    with pytest.raises(NoReadyWorker) as exc:
        await asyncio.wait_for(pool.dispatch(WorkerRequest(b"x"), 30), 2)
    assert exc.value.status == 503
    # The answer says why: the workers went down. Which sign of it the pool saw last depends
    # on the order the kernel reports them in: the killed process's exit code, or its
    # connection closing first (the process reaped a moment later).
    went_down = "service echo is not ready: its workers went down: "
    assert exc.value.message.startswith(went_down), exc.value.message
    why = exc.value.message.removeprefix(went_down)
    assert why.startswith(("exited with code -9", "connection lost")), exc.value.message
    assert await pool.wait_ready(20)
    assert (await pool.dispatch(WorkerRequest(b"back"), 5)).body == b"back"


async def test_timeout_cancels_a_queued_request(make_pool: MakePool) -> None:
    """A request that timed out while queued behind a slow one never runs."""
    pool = await make_pool(echo_service())
    # The slow run outlasts the steps below by far; each step waits for its own condition.
    slow = asyncio.create_task(pool.dispatch(WorkerRequest(b"sleep:2"), 10))
    await _until(lambda: pool.snapshot()[0]["outstanding"] == 1, 5, "slow request in flight")
    with pytest.raises(UpstreamTimeout) as exc:
        await pool.dispatch(WorkerRequest(b"count"), 0.2)
    assert exc.value.status == 504
    # A caller that goes away (cancellation) also cancels its upstream call: once the worker
    # holds it (the slow run, the timed-out call and this one).
    gone = asyncio.create_task(pool.dispatch(WorkerRequest(b"count"), 5))
    await _until_worker_holds(pool, 3)
    gone.cancel()
    assert (await slow).body == b"slept 2"
    stats = await pool.worker_stats(0)
    assert stats["runs"] == 1 and stats["dropped"] == 2 and stats["outstanding"] == 0
    assert (await pool.dispatch(WorkerRequest(b"count"), 5)).body == b"2"
    assert pool.pending == 0 and pool.snapshot()[0]["outstanding"] == 0
    await _until(lambda: pool.snapshot()[0]["runs"] == 2, 5, "counters in the snapshot")
    assert pool.snapshot()[0]["dropped"] == 2


async def test_pending_limit_gives_overloaded(make_pool: MakePool) -> None:
    pool = await make_pool(echo_service(max_pending=2))
    slow = [asyncio.create_task(pool.dispatch(WorkerRequest(b"sleep:0.5"), 5)) for _ in range(2)]
    await _until(lambda: pool.pending == 2, 5, "both slow requests pending")
    with pytest.raises(PoolOverloaded) as exc:
        await pool.dispatch(WorkerRequest(b"x"), 5)
    assert exc.value.status == 450 and exc.value.headers.get("Retry-After")
    assert [r.status for r in await asyncio.gather(*slow)] == [200, 200]


async def test_corrupt_model_never_ready_and_backs_off(make_pool: MakePool, tmp_path: Path) -> None:
    """A model that cannot load: never ready, fast 503, restarts slowed by back-off."""
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    svc = ServiceConfig(name="broken", processor="onnx", model=str(bad), workers=1)
    pool = await make_pool(svc, ready=False)
    started = time.monotonic()
    assert not await pool.wait_ready(20)  # returns early: every worker failed to load
    with pytest.raises(NoReadyWorker) as exc:
        await pool.dispatch(WorkerRequest(b"{}"), 5)
    # The 503 names the cause, without the model's directory; Retry-After: the next attempt.
    assert "is not ready: its workers failed to start: " in exc.value.message
    assert "corrupt.onnx" in exc.value.message and str(tmp_path) not in exc.value.message
    assert 1 <= int(exc.value.headers["Retry-After"]) <= 2
    await _until(lambda: pool.restarts_total >= 1, 30, "a restart after the back-off")
    elapsed = time.monotonic() - started
    snap = pool.snapshot()[0]
    assert snap["state"] in ("failed", "starting", "down") and snap["last_error"]
    assert pool.metadata is None  # no worker was ever ready: nothing to describe
    assert "protobuf" in snap["last_error"].lower() or "load" in snap["last_error"].lower()
    # Back-off after failed starts: 0.5, 1, 2, 4 s between attempts (plus start time):
    # in `elapsed` seconds no more restarts than the schedule allows (a slow machine only
    # makes fewer).
    allowed = 0
    budget = elapsed
    for delay in (0.5, 1.0, 2.0, 4.0):
        if budget < delay:
            break
        budget -= delay
        allowed += 1
    assert 1 <= pool.restarts_total <= allowed


async def test_worker_http_endpoint_enforces_auth(make_pool: MakePool) -> None:
    """Direct-mode HTTP on a worker checks the same tokens as the gateway."""
    token = "s3cret-token-for-worker-tests"
    pool = await make_pool(echo_service(name="secure", token=token))
    host, port = pool.ready_endpoints()[0]
    url = f"http://{host}:{port}/api/predict/secure"
    async with aiohttp.ClientSession() as s:
        async with s.post(url, data=b"hello") as r:
            assert r.status == 401
            assert token not in await r.text()
        async with s.post(url, data=b"hello", headers={"Authorization": "wrong"}) as r:
            assert r.status == 401
        async with s.post(url, data=b"hello", headers={"Authorization": token}) as r:
            assert (r.status, await r.read()) == (200, b"hello")
        headers = signed_headers(token, b"hello", "secure")
        async with s.post(url, data=b"hello", headers=headers) as r:
            assert (r.status, await r.read()) == (200, b"hello")
        headers = signed_headers(token, b"hello", "secure")
        async with s.post(url, data=b"tampered", headers=headers) as r:
            assert r.status in (400, 401)
        async with s.post(url + "/sub/path", data=b"pid", headers={"Authorization": token}) as r:
            assert r.status == 200 and int(await r.read()) == pool.snapshot()[0]["pid"]
        slow = {"Authorization": token, "X-Eas-Deadline-Ms": "5"}
        async with s.post(url, data=b"x", headers=slow) as r:
            assert r.status == 408 and (await r.json())["code"] == "DeadlineExceeded"
        async with s.get(f"http://{host}:{port}/healthz") as r:
            assert r.status == 200 and (await r.json())["status"] == "ok"
        async with s.post(f"http://{host}:{port}/api/predict/other", data=b"x") as r:
            assert r.status == 404


async def test_worker_http_lean_path_and_aiohttp_fallback_agree(make_pool: MakePool) -> None:
    """The worker's port answers plain POSTs on the lean protocol (no Server header) and hands
    anything else (a chunked body, another method) to aiohttp on the same connection."""
    token = "lean-path-token-0123456789"
    pool = await make_pool(echo_service(name="lean", token=token))
    host, port = pool.ready_endpoints()[0]
    url = f"http://{host}:{port}/api/predict/lean"
    auth = {"Authorization": token}

    async def chunks() -> AsyncIterator[bytes]:
        yield b"hel"
        yield b"lo"

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        async with s.post(url, data=b"hello", headers=auth) as r:
            assert (r.status, await r.read(), "Server" in r.headers) == (200, b"hello", False)
        async with s.post(url, data=b"x", headers={"Authorization": "wrong"}) as r:
            assert (r.status, (await r.json())["code"], "Server" in r.headers) == (401, "Unauthorized", False)
        async with s.post(url, data=chunks(), headers=auth) as r:  # chunked: aiohttp from now on
            assert (r.status, await r.read(), "Server" in r.headers) == (200, b"hello", True)
        async with s.get(url, headers=auth) as r:
            assert r.status == 405
        gz = {**auth, "Content-Encoding": "gzip"}
        async with s.post(url, data=gzip.compress(b"hello"), headers=gz) as r:
            assert (r.status, (await r.json())["code"]) == (415, "UnsupportedMediaType")  # as the gateway
        # The connection handed to aiohttp keeps working.
        async with s.post(url, data=b"again", headers=auth) as r:
            assert (r.status, await r.read()) == (200, b"again")


async def test_worker_http_port_keeps_the_gateways_connection_limits(make_pool: MakePool) -> None:
    """An idle kept-alive connection and a head that never completes are closed on the
    worker's port too (keepalive_timeout_s, header_timeout_s)."""
    pool = await make_pool(echo_service(), fast_gateway(keepalive_timeout_s=0.4, header_timeout_s=0.4))
    host, port = pool.ready_endpoints()[0]

    async def closed_after(data: bytes, expect_answer: bool) -> float:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(data)
            t0 = time.monotonic()
            got = await asyncio.wait_for(reader.read(), 5.0)  # until the worker closes
            assert (b"HTTP/1.1 200" in got) is expect_answer
            return time.monotonic() - t0
        finally:
            writer.close()

    # Closed at all (the read above waits 5 s, far less than the defaults), and not at once:
    # after the limit (a timer never fires early; a slow machine only makes it later).
    req = b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
    assert await closed_after(req, expect_answer=True) > 0.2  # answered, then idle
    assert await closed_after(b"POST /api/predict/echo HTTP/1.1\r\nHo", expect_answer=False) > 0.2


async def test_stop_drains_in_flight_requests(models: dict[str, Path]) -> None:
    pool = WorkerPool(echo_service(), fast_gateway())
    await pool.start()
    try:
        assert await pool.wait_ready(30) and pool.is_ready()
        pid = pool.snapshot()[0]["pid"]
        inflight = asyncio.create_task(pool.dispatch(WorkerRequest(b"sleep:1"), 5))
        await _until(lambda: pool.snapshot()[0]["outstanding"] == 1, 5, "the request in flight")
        stopper = asyncio.create_task(pool.stop(5))
        await _until(lambda: pool._stopping, 5, "the pool stopping")
        assert not inflight.done()
        # Its worker still finishes the call, but the pool takes no more: not ready, saying why.
        assert not pool.is_ready() and pool.not_ready_reason() == "the service is stopping"
        with pytest.raises(NoReadyWorker):
            await pool.dispatch(WorkerRequest(b"late"), 5)
        assert (await inflight).body == b"slept 1"
        await stopper
    finally:
        await pool.stop(1)
    assert [w["state"] for w in pool.snapshot()] == ["stopped"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_expired_deadline_is_answered_without_running(make_pool: MakePool) -> None:
    """A request whose deadline passes while it is queued gets 504 and never runs."""
    pool = await make_pool(echo_service())
    slow = asyncio.create_task(pool.dispatch(WorkerRequest(b"sleep:0.5"), 5))
    await _until(lambda: pool.snapshot()[0]["outstanding"] == 1, 5, "slow request in flight")
    late = WorkerRequest(b"count", deadline=time.monotonic() + 0.1)
    resp = await pool.dispatch(late, 5)
    assert resp.status == 504 and json.loads(resp.body)["code"] == "UpstreamTimeout"
    await slow
    stats = await pool.worker_stats(0)
    assert (stats["runs"], stats["dropped"]) == (1, 1)


async def test_stopped_worker_is_ejected_and_rejoins(make_pool: MakePool) -> None:
    """A SIGSTOPped worker misses pings, leaves routing, and rejoins after SIGCONT."""
    pool = await make_pool(echo_service(workers=2))
    await _until(lambda: len(pool.ready_endpoints()) == 2, 20, "both workers ready")
    frozen = pool.snapshot()[0]["pid"]
    os.kill(frozen, signal.SIGSTOP)
    try:
        await _until(lambda: pool.snapshot()[0]["state"] == "ejected", 15, "stopped worker ejected")
        seen = {await _pid(pool) for _ in range(10)}
        assert seen == {pool.snapshot()[1]["pid"]}
    finally:
        os.kill(frozen, signal.SIGCONT)
    await _until(lambda: pool.snapshot()[0]["state"] == "ready", 15, "worker back in routing")
    assert pool.snapshot()[0]["pid"] == frozen and pool.restarts_total == 0


_REF_DIRECT = r"""
import json, sys
from eas_prediction import PredictClient, PredictException, TFRequest, TorchRequest, StringRequest
c = PredictClient(sys.argv[1], 'digits')
c.set_token(sys.argv[2])
c.init()
out = {}
tf = TFRequest('predict')
tf.add_feed('input', [2, 64], TFRequest.DT_FLOAT, [0.25] * 128)
tf.add_fetch('label')
r = c.predict(tf)
out['tf_label'] = list(r.get_values('label'))
out['tf_shape'] = r.get_tensor_shape('label')
for flag in (False, True):
    t = TorchRequest(flag)
    t.add_feed(0, [2, 64], TorchRequest.DT_FLOAT, [0.25] * 128)
    r = c.predict(t)
    out['torch_%s' % flag] = [list(r.get_values(0)), r.get_tensor_shape(1)]
bad = TFRequest('predict')
bad.add_feed('input', [3, 5], TFRequest.DT_INT64, list(range(15)))
try:
    c.predict(bad)
except PredictException as e:
    out['bad'] = [e.code, e.message.decode() if isinstance(e.message, bytes) else e.message]
s = c.predict(StringRequest(json.dumps({'inputs': {'input': [[0.25] * 64]}, 'outputs': ['label']})))
out['json'] = json.loads(s.response_data)
print(json.dumps(out))
"""


@pytest.mark.compat
async def test_reference_client_direct_to_a_worker(make_pool: MakePool, models: dict[str, Path]) -> None:
    """The real eas-prediction client talks to a worker's own HTTP port (direct mode)."""
    from tests.eas_reference import run_reference

    token = "digits-token-for-reference-test"
    svc = ServiceConfig(name="digits", processor="onnx", model=str(models["digits"]), token=token)
    pool = await make_pool(svc)
    host, port = pool.ready_endpoints()[0]
    proc = await asyncio.to_thread(run_reference, _REF_DIRECT, f"{host}:{port}", token)
    out = json.loads(proc.stdout)
    label = out["tf_label"]
    assert len(label) == 2 and label[0] == label[1] and out["tf_shape"] == [2]
    assert out["torch_False"] == [label, [2, 10]] and out["torch_True"] == [label, [2, 10]]
    assert out["bad"][0] == 400
    assert json.loads(out["bad"][1])["message"] == "input 'input': expected float32[N,64], got int64[3,5]"
    assert out["json"]["outputs"]["label"] == {"dtype": "int64", "shape": [1], "data": [label[0]]}


async def test_timeout_interrupts_a_running_onnx_model(make_pool: MakePool, models: dict[str, Path]) -> None:
    """A cancel reaches a model already running: ONNX Runtime's terminate flag frees the worker."""
    pool = await make_pool(ServiceConfig(name="spin", processor="onnx", model=str(models["spin"])))
    ok = await pool.dispatch(WorkerRequest(b'{"inputs": {"n": 1000}}'), 5)
    assert json.loads(ok.body)["outputs"]["count"]["data"] == [1000.0]
    with pytest.raises(UpstreamTimeout):  # about 60 s of work if it were not interrupted
        await pool.dispatch(WorkerRequest(b'{"inputs": {"n": 60000000}}'), 0.3)
    resp = await pool.dispatch(WorkerRequest(b'{"inputs": {"n": 10}}'), 5)
    assert json.loads(resp.body)["outputs"]["count"]["data"] == [10.0]
    stats = await pool.worker_stats(0)
    assert stats["runs"] == 3 and stats["outstanding"] == 0


async def test_a_start_timeout_leaves_no_reader_on_the_pipe(make_pool: MakePool) -> None:
    """A worker that misses its start timeout is torn down, its pipe closed. Nothing may stay
    registered on that file descriptor: the number is reused by the next file opened, and a
    stale reader firing on it would spin the event loop."""
    svc = echo_service(config={"initialize_sleep_s": 30})
    pool = await make_pool(svc, fast_gateway(worker_start_timeout_s=0.3), ready=False)
    # Waiting out its back-off after the timeout: the pipe is closed, no new one yet.
    await _until(lambda: pool.snapshot()[0]["state"] == "failed", 10, "the start timeout")
    loop = asyncio.get_running_loop()
    stale = []
    for fd in range(3, 1024):
        try:
            os.fstat(fd)
        except OSError:  # closed: nothing may be registered on it
            if loop.remove_reader(fd):
                stale.append(fd)
    assert not stale


async def test_a_pool_stopped_while_its_workers_start_reports_no_failure(
    make_pool: MakePool, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway that stops during its start (a port it could not bind) stops the workers it
    started without logging their cut-short starts as failures."""
    svc = echo_service(workers=2, config={"initialize_sleep_s": 30})
    pool = await make_pool(svc, ready=False)
    await _until(lambda: all(w.get("pid") for w in pool.snapshot()), 10, "both workers spawned")
    with caplog.at_level(logging.DEBUG, logger="gateway"):
        await pool.stop(1.0)
    assert not [
        r.getMessage() for r in caplog.records if "start" in r.getMessage() and r.levelno >= logging.WARNING
    ]
    assert not [r.getMessage() for r in caplog.records if "failed to start" in r.getMessage()]
