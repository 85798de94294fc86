"""A worker that cannot compute must not look healthy, and its direct HTTP port keeps the
gateway's deadlines: real spawned workers (the processors load by their
``package.module:Class`` entry), plus in-process checks of the compute queue."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from gateway.backends.pool import NoReadyWorker, WorkerPool
from gateway.config import ServiceConfig
from gateway.core.calls import WorkerRequest
from gateway.worker.compute import ComputeQueue
from gateway.worker.processors.registry import create_processor
from tests.gateway.workers.conftest import echo_service, fast_gateway

pytestmark = pytest.mark.timeout(60)

MakePool = Callable[..., Any]
# The package.module:Class form, imported by the spawned worker (the repository root is
# on its PYTHONPATH), not a file path.
MISBEHAVING = "tests.gateway.workers.fixture_processors:Misbehaving"


def misbehaving(**kw: Any) -> ServiceConfig:
    return ServiceConfig(**{"name": "mis", "processor": "python", "entry": MISBEHAVING, "workers": 1, **kw})


async def _pid(pool: WorkerPool) -> int:
    resp = await pool.dispatch(WorkerRequest(b"pid"), 3)
    assert resp.status == 200, resp.body
    return int(resp.body)


async def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("body", "name"),
    [(b"exit", "SystemExit"), (b"interrupt", "KeyboardInterrupt"), (b"generator-exit", "GeneratorExit")],
)
async def test_base_exception_in_process_is_answered_and_the_worker_keeps_serving(
    make_pool: MakePool, body: bytes, name: str
) -> None:
    """SystemExit & co. from process() used to end the compute thread: the request and every
    later one went unanswered while pings (the event loop) kept the worker "ready"."""
    pool = await make_pool(misbehaving())
    pid = await _pid(pool)
    for _ in range(2):
        resp = await pool.dispatch(WorkerRequest(body, request_id="r-1"), 3)
        assert resp.status == 400, resp.body
        err = json.loads(resp.body)
        assert (err["code"], err["request_id"]) == ("ProcessorError", "r-1")
        assert name in err["message"]
        resp = await pool.dispatch(WorkerRequest(b"still here"), 3)
        assert (resp.status, resp.body) == (200, b"still here")
    assert await _pid(pool) == pid
    assert pool.restarts_total == 0
    stats = await pool.worker_stats(0)
    assert stats["unhealthy"] is None


async def test_a_stuck_compute_thread_gets_the_worker_restarted(make_pool: MakePool) -> None:
    """A run that makes no progress for stall_timeout_s while other requests wait behind it:
    the worker says so in its health ping and the pool restarts it (the waiting requests fail
    fast instead of timing out one by one)."""
    pool = await make_pool(misbehaving(stall_timeout_s=0.5))
    pid = await _pid(pool)
    # A long run with nobody waiting is no stall.
    resp = await pool.dispatch(WorkerRequest(b"sleep:1.0"), 5)
    assert (resp.status, resp.body) == (200, b"slept")
    assert pool.restarts_total == 0
    stuck = asyncio.create_task(pool.dispatch(WorkerRequest(b"sleep:30"), 40))
    await _until_outstanding(pool, 1)  # the long run is the worker's, and first in line
    waiting = asyncio.create_task(pool.dispatch(WorkerRequest(b"waits"), 40))
    for task in (stuck, waiting):
        # NoReadyWorker, not a timeout: the only worker was restarted (no other to retry on)
        # well before the requests' own 40 s ran out.
        with pytest.raises(NoReadyWorker):
            await asyncio.wait_for(task, 30)
    await _until(lambda: bool(pool.ready_endpoints()), 20, "the restarted worker")
    assert pool.restarts_total == 1
    assert await _pid(pool) != pid


async def _until_outstanding(pool: WorkerPool, n: int) -> None:
    """Until the worker holds ``n`` requests (running or queued), asked by health pings."""
    deadline = time.monotonic() + 10
    while (await pool.worker_stats(0))["outstanding"] < n:
        assert time.monotonic() < deadline, f"the worker never held {n} request(s)"
        await asyncio.sleep(0.01)


async def test_health_reports_a_dead_compute_thread() -> None:
    loop = asyncio.get_running_loop()
    proc = create_processor(misbehaving())
    proc.load()
    compute = ComputeQueue(loop, proc, stall_s=1.0)
    try:
        assert compute.stats()["unhealthy"] is None
        compute._q.put(None)  # the thread leaves as if asked to stop, but nobody asked
        compute._threads[0].join(2)
        assert "compute thread" in compute.stats()["unhealthy"]
    finally:
        compute.shutdown()
    assert compute.stats()["unhealthy"] is None  # stopping on purpose is no fault


# --- the worker's direct HTTP port --------------------------------------------------------


async def _exchange(
    host: str, port: int, data: bytes, pause_s: float = 0.0, more: bytes = b""
) -> tuple[bytes, float]:
    """Send ``data`` (then ``more`` after ``pause_s``) and read until the worker closes: the
    bytes, and the seconds until the status line came."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        t0 = time.monotonic()
        writer.write(data)
        if more:
            await asyncio.sleep(pause_s)
            writer.write(more)
        line = await asyncio.wait_for(reader.readline(), 5.0)
        elapsed = time.monotonic() - t0
        return line + await asyncio.wait_for(reader.read(), 5.0), elapsed
    finally:
        writer.close()


async def test_slow_body_is_408_within_the_body_timeout_on_both_paths(make_pool: MakePool) -> None:
    """The lean protocol hands a late body to aiohttp; aiohttp used to wait for it forever."""
    body_timeout_s = 0.5
    pool = await make_pool(echo_service(), fast_gateway(body_timeout_s=body_timeout_s))
    host, port = pool.ready_endpoints()[0]
    lean = b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"
    chunked = b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    for data in (lean, chunked):
        got, elapsed = await _exchange(host, port, data)  # an answer at all: not forever
        assert got.startswith(b"HTTP/1.1 408"), got[:200]
        head, _, body = got.partition(b"\r\n\r\n")
        assert json.loads(body)["code"] == "RequestTimeout"
        # A plain body's 408 comes from the lean protocol itself, not from aiohttp after it
        # (which would have waited a body timeout of its own); a chunked one is aiohttp's.
        assert (b"\r\nServer: " in head) is (data is chunked)
        assert elapsed > body_timeout_s * 0.9  # after the body timeout (a timer never fires early)
    resp = await pool.dispatch(WorkerRequest(b"count"), 3)
    assert resp.body == b"1", "a timed-out body reached the processor"


async def test_client_leaving_mid_body_is_quiet(
    make_pool: MakePool, capfd: pytest.CaptureFixture[str]
) -> None:
    pool = await make_pool(echo_service(), fast_gateway(body_timeout_s=0.3))
    host, port = pool.ready_endpoints()[0]
    heads = [
        b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc",
        b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
    ]
    for data in heads:
        for after_408 in (False, True):  # leaves at once, or after its 408 (the body timeout)
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(data)
            await writer.drain()
            if after_408:
                assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HTTP/1.1 408")
            writer.transport.abort()
    # A body sent after all of them that times out too: the worker's body timers run in the
    # order they were set, so whatever the earlier connections make it log is written by now.
    got, _ = await _exchange(host, port, heads[0])
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert (await pool.dispatch(WorkerRequest(b"count"), 3)).body == b"1"
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    assert not re.search(r"\b(ERROR|CRITICAL)\b", err), err[-3000:]


async def test_direct_port_replies_carry_a_request_id(make_pool: MakePool) -> None:
    token = "rid-token-0123456789abcdef"
    pool = await make_pool(echo_service(name="rid", token=token))
    host, port = pool.ready_endpoints()[0]
    url = f"http://{host}:{port}/api/predict/rid"
    auth = {"Authorization": token}

    async def chunked() -> AsyncIterator[bytes]:
        yield b"hel"
        yield b"lo"

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        for data in (b"hello", None):  # the lean protocol, then aiohttp (a chunked body)
            body: Any = data if data is not None else chunked()
            async with s.post(url, data=body, headers={**auth, "X-Request-Id": "abc-123.x:y"}) as r:
                assert (r.status, r.headers["X-Request-Id"]) == (200, "abc-123.x:y")
            body = data if data is not None else chunked()
            async with s.post(url, data=body, headers={**auth, "X-Request-Id": "a b<script>"}) as r:
                assert r.status == 200
                assert re.fullmatch(r"[0-9a-f]{32}", r.headers["X-Request-Id"])
            body = data if data is not None else chunked()
            async with s.post(url, data=body) as r:  # an error reply: the id is in the body too
                assert r.status == 401
                rid = r.headers["X-Request-Id"]
                assert re.fullmatch(r"[0-9a-f]{32}", rid)
                assert (await r.json())["request_id"] == rid


async def test_missing_or_wrong_raw_token_is_401_before_the_body(make_pool: MakePool) -> None:
    token = "early-token-0123456789abcdef"
    # Longer than _exchange waits for an answer: a 401 that came only once the body timed
    # out would not come at all.
    pool = await make_pool(echo_service(name="early", token=token), fast_gateway(body_timeout_s=60.0))
    host, port = pool.ready_endpoints()[0]
    head = b"POST /api/predict/early HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nConnection: close\r\n"
    for auth in (b"", b"Authorization: wrong\r\n"):
        got, _ = await _exchange(host, port, head + auth + b"\r\nabc")  # 97 bytes never sent
        assert got.startswith(b"HTTP/1.1 401"), got[:200]
    # The right raw token, or a signature (it needs the body), waits for the body: the rest
    # of it comes late, and the echo answers all 100 bytes.
    got, _ = await _exchange(
        host, port, head + b"Authorization: " + token.encode() + b"\r\n\r\nabc", 0.3, b"x" * 97
    )
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    assert got.partition(b"\r\n\r\n")[2] == b"abc" + b"x" * 97
