"""The dispatcher against the real queue store (SQLite) and a scripted in-process pool."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.config import QueueConfig, ServiceConfig
from gateway.core import errors
from gateway.core.calls import WorkerRequest, WorkerResponse
from gateway.queue.dispatcher import DISPATCH_GROUP, Dispatcher, worker_capacity
from gateway.queue.manager import QueueManager
from tests.gateway.doubles import BackendDouble
from tests.gateway.queue.conftest import async_service as _svc

# The real request and response types the pool carries.
Req = WorkerRequest
Resp = WorkerResponse


# The gateway's own errors, as gateway.backends.pool raises them (its classes derive from these).
NoReadyWorker = errors.ServiceNotReady
UpstreamTimeout = errors.UpstreamTimeout


@dataclass
class FakePool(BackendDouble):
    """Replies ``reply(body)``; records concurrency and calls."""

    reply: Callable[[bytes], Resp | BaseException]
    delay: float = 0.0
    calls: list[str] = field(default_factory=list)
    inflight: int = 0
    max_inflight: int = 0
    service: ServiceConfig = field(default_factory=_svc)

    async def dispatch(self, req: Req, timeout: float) -> Resp:
        self.calls.append(req.request_id)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            await asyncio.sleep(self.delay)
            out = self.reply(req.body)
            if isinstance(out, BaseException):
                raise out
            return out
        finally:
            self.inflight -= 1


def _echo(body: bytes) -> Resp:
    return Resp(200, b"out:" + body)


async def _put(
    qm: QueueManager, data: bytes, tags: dict[str, str] | None = None, rid: str | None = None
) -> str:
    _idx, rid_out, dur = qm.queue("asvc").put(data, tags or {}, rid)
    if dur is not None:
        await dur
    return rid_out


async def _wait(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def _sink(qm: QueueManager) -> dict[str, Any]:
    return {r.rid: r for r in qm.queue("asvc/sink").records.values()}


async def _dispatcher(
    qm: QueueManager, pool: FakePool, svc: ServiceConfig | None = None, **kw: Any
) -> Dispatcher:
    d = Dispatcher(svc or _svc(), pool, qm.queue("asvc"), qm.queue("asvc/sink"), Req, **kw)
    await d.start()
    return d


async def test_every_record_one_result_with_tags(qm: QueueManager) -> None:
    pool = FakePool(_echo, delay=0.001)
    d = await _dispatcher(qm, pool)
    rids = [await _put(qm, f"x{i}".encode(), {"uri": f"u{i}"}) for i in range(200)]
    await _wait(lambda: len(_sink(qm)) == 200 and qm.queue("asvc").length == 0)
    await d.stop()
    sink = _sink(qm)
    assert set(sink) == set(rids)
    for i, rid in enumerate(rids):
        rec = sink[rid]
        assert rec.data == f"out:x{i}".encode()
        assert rec.tags["requestId"] == rid
        assert rec.tags["status"] == "200"
        assert rec.tags["uri"] == f"u{i}"
    # the window (worker capacity) bounds what is in flight at the workers
    assert 1 < pool.max_inflight <= worker_capacity(_svc()) == d.window
    assert d.snapshot()["results_total"] == 200


async def test_processor_error_is_a_result_not_a_retry(qm: QueueManager) -> None:
    pool = FakePool(lambda b: Resp(400, b'{"code":"InvalidInput","message":"bad"}'))
    d = await _dispatcher(qm, pool)
    rid = await _put(qm, b"bad")
    await _wait(lambda: rid in _sink(qm) and qm.queue("asvc").length == 0)
    await asyncio.sleep(0.05)
    await d.stop()
    assert pool.calls == [rid]
    rec = _sink(qm)[rid]
    assert rec.tags["status"] == "400" and b"InvalidInput" in rec.data


async def test_empty_reply_writes_nothing(qm: QueueManager) -> None:
    pool = FakePool(lambda b: Resp(200, b"") if b == b"skip" else _echo(b))
    d = await _dispatcher(qm, pool)
    skip = await _put(qm, b"skip")
    keep = await _put(qm, b"keep")
    await _wait(lambda: keep in _sink(qm) and qm.queue("asvc").length == 0)
    await d.stop()
    assert skip not in _sink(qm)
    assert d.snapshot()["empty_total"] == 1


async def test_redelivered_record_does_not_double_the_result(qm: QueueManager) -> None:
    # A crash after the sink write and before the input commit: the result is there already.
    rid = "rid-crashed-0001"
    _i, _r, dur = qm.queue("asvc/sink").put(b"out:first", {"status": "200"}, rid)
    if dur is not None:
        await dur
    await _put(qm, b"again", rid=rid)
    pool = FakePool(_echo)
    d = await _dispatcher(qm, pool)
    await _wait(lambda: qm.queue("asvc").length == 0)
    await d.stop()
    assert pool.calls == [rid]  # the work repeats ...
    sink = list(qm.queue("asvc/sink").records.values())
    assert [r.rid for r in sink] == [rid]  # ... the result does not
    assert sink[0].data == b"out:first"


async def test_unavailable_workers_are_retried_then_succeed(qm: QueueManager) -> None:
    state = {"n": 0}

    def flaky(body: bytes) -> Resp | BaseException:
        state["n"] += 1
        return NoReadyWorker("no ready worker") if state["n"] <= 3 else _echo(body)

    d = await _dispatcher(qm, FakePool(flaky))
    rid = await _put(qm, b"a")
    await _wait(lambda: rid in _sink(qm))
    await d.stop()
    assert _sink(qm)[rid].tags["status"] == "200"
    assert d.snapshot()["retries_total"] == 3


async def test_timeouts_end_in_an_error_result(qm: QueueManager) -> None:
    pool = FakePool(lambda b: UpstreamTimeout("upstream timeout"))
    d = await _dispatcher(qm, pool, timeout_attempts=2)
    rid = await _put(qm, b"slow")
    await _wait(lambda: rid in _sink(qm) and qm.queue("asvc").length == 0)
    await d.stop()
    assert len(pool.calls) == 2
    assert _sink(qm)[rid].tags["status"] == "504"


async def test_retry_budget_ends_in_an_error_result(qm: QueueManager) -> None:
    d = await _dispatcher(qm, FakePool(lambda b: NoReadyWorker("down")), retry_for_s=0.2)
    rid = await _put(qm, b"a")
    await _wait(lambda: rid in _sink(qm))
    await d.stop()
    assert _sink(qm)[rid].tags["status"] == "503"


async def test_sink_full_stops_taking_input_until_drained(tmp_path: Path) -> None:
    svc = _svc(workers=1, max_length=5)
    m = QueueManager([svc], str(tmp_path))
    await m.start()
    try:
        pool = FakePool(_echo)
        d = await _dispatcher(m, pool, svc)
        # (The service's queue block bounds both its input queue and its sink.)
        sink = m.queue("asvc/sink")
        rids = [await _put(m, f"r{i}".encode()) for i in range(5)]
        await _wait(lambda: sink.length == 5 and m.queue("asvc").length == 0)
        rids += [await _put(m, f"r{i}".encode()) for i in range(5, 10)]
        await asyncio.sleep(0.2)
        # Full: no more results, the input keeps every record not yet in the sink.
        assert sink.length == 5
        assert m.queue("asvc").length == 5
        assert len(pool.calls) == 5  # no inference while the sink is full
        assert d.snapshot()["sink_full_waits"] > 0
        # Drain (as a consumer would) and everything arrives.
        seen: set[str] = set()
        while len(seen) < 10:
            await _wait(lambda: sink.length > 0)
            recs, dur = sink.get(0, 100, True, None, {})
            if dur is not None:
                await dur
            seen.update(r.rid for r in recs)
        assert seen == set(rids)
        await _wait(lambda: m.queue("asvc").length == 0)
        await d.stop()
    finally:
        await m.stop()


async def test_stop_leaves_unfinished_records_for_the_next_dispatcher(qm: QueueManager) -> None:
    gate = asyncio.Event()

    class Blocking(FakePool):
        async def dispatch(self, req: Req, timeout: float) -> Resp:
            self.calls.append(req.request_id)
            await gate.wait()
            return _echo(req.body)

    d = await _dispatcher(qm, Blocking(_echo))
    rids = [await _put(qm, f"b{i}".encode()) for i in range(4)]
    await asyncio.sleep(0.1)
    await d.stop(timeout=0.05)  # in-flight records are cancelled uncommitted
    assert qm.queue("asvc").length == 4 and not _sink(qm)
    gate.set()
    d2 = await _dispatcher(qm, FakePool(_echo))
    await _wait(lambda: len(_sink(qm)) == 4 and qm.queue("asvc").length == 0)
    await d2.stop()
    assert set(_sink(qm)) == set(rids)
    assert json.dumps(d2.snapshot())
    assert DISPATCH_GROUP in qm.queue("asvc").groups


async def test_a_store_failure_is_retried_not_stranded(
    qm: QueueManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = qm.queue("asvc/sink")
    real_put = sink.put_many
    failures = {"n": 0}

    def flaky_put(items: Any) -> Any:
        if failures["n"] < 2:
            failures["n"] += 1
            raise OSError("disk I/O error")
        return real_put(items)

    monkeypatch.setattr(sink, "put_many", flaky_put)
    d = await _dispatcher(qm, FakePool(_echo))
    rid = await _put(qm, b"x")
    await _wait(lambda: rid in _sink(qm) and qm.queue("asvc").length == 0)
    await d.stop()
    assert failures["n"] == 2 and len(_sink(qm)) == 1


async def test_an_empty_error_reply_is_still_a_result(qm: QueueManager) -> None:
    replies = {b"fail": Resp(503, b""), b"skip": Resp(200, b""), b"bad": Resp(400, b"")}
    pool = FakePool(lambda b: replies[b])
    d = await _dispatcher(qm, pool)
    rids = {k: await _put(qm, k) for k in replies}
    await _wait(lambda: qm.queue("asvc").length == 0 and len(_sink(qm)) == 2)
    await d.stop()
    sink = _sink(qm)
    assert rids[b"skip"] not in sink  # only a 200 with an empty body writes nothing
    for key, status in ((b"fail", "503"), (b"bad", "400")):
        rec = sink[rids[key]]
        assert rec.tags["status"] == status and b"empty body" in rec.data
    assert d.snapshot()["empty_total"] == 1 and d.snapshot()["errors_total"] == 2


@dataclass
class BootingPool(FakePool):
    """No worker is ready until ``ready`` is set (as WorkerPool: is_ready, NoReadyWorker)."""

    ready: bool = False

    async def dispatch(self, req: Req, timeout: float) -> Resp:
        if not self.ready:
            self.calls.append(req.request_id)
            raise NoReadyWorker("no ready worker")
        return await super().dispatch(req, timeout)


async def test_waits_for_a_ready_worker_instead_of_writing_503s(qm: QueueManager) -> None:
    """Workers still booting (after a restart, a slow model): the backlog waits for them
    instead of spending the retry budget and turning into 503 results."""
    pool = BootingPool(_echo)
    d = await _dispatcher(qm, pool, retry_for_s=0.1)
    rids = [await _put(qm, f"r{i}".encode()) for i in range(5)]
    await asyncio.sleep(0.6)
    assert not _sink(qm) and qm.queue("asvc").length == 5
    pool.ready = True
    await _wait(lambda: len(_sink(qm)) == 5 and qm.queue("asvc").length == 0)
    await d.stop()
    assert {r.tags["status"] for r in _sink(qm).values()} == {"200"} and set(_sink(qm)) == set(rids)
    assert d.snapshot()["ready_waits"] >= 1


@pytest.mark.timeout(20)  # the failure this guards against is a hang
async def test_a_pool_that_answers_wait_ready_at_once_leaves_the_event_loop_free(qm: QueueManager) -> None:
    """A pool served by remote workers only returns from ``wait_ready`` at once, ready or not:
    the dispatcher waiting for it must leave the event loop to the rest of the gateway (here:
    to this test, which makes the pool ready once the dispatcher waits)."""

    @dataclass
    class Eager(BootingPool):
        async def wait_ready(self, timeout: float) -> bool:
            return True

    pool = Eager(_echo)
    d = await _dispatcher(qm, pool, retry_for_s=0.1)
    rid = await _put(qm, b"r")
    await _wait(lambda: d.snapshot()["ready_waits"] >= 1)
    pool.ready = True
    await _wait(lambda: rid in _sink(qm))
    await d.stop()
    assert _sink(qm)[rid].tags["status"] == "200"


async def test_a_record_in_flight_when_workers_go_down_waits_for_them(qm: QueueManager) -> None:
    pool = BootingPool(_echo, ready=True)
    loop = asyncio.get_running_loop()

    def down_once(body: bytes) -> Resp | BaseException:
        if not pool.calls[:-1]:  # the first call: every worker went away, back in 0.5 s
            pool.ready = False
            loop.call_later(0.5, setattr, pool, "ready", True)
            return NoReadyWorker("no ready worker")
        return _echo(body)

    pool.reply = down_once
    d = await _dispatcher(qm, pool, retry_for_s=0.1)
    rid = await _put(qm, b"a")
    await _wait(lambda: rid in _sink(qm))
    await d.stop()
    assert _sink(qm)[rid].tags["status"] == "200"


async def test_tags_reach_the_worker_as_headers(qm: QueueManager) -> None:
    seen: list[Req] = []

    class Recording(FakePool):
        async def dispatch(self, req: Req, timeout: float) -> Resp:
            seen.append(req)
            return _echo(req.body)

    d = await _dispatcher(qm, Recording(_echo))
    tags = {
        "uri": "u1",
        "Content-Type": "application/json",
        "X-Eas-Request-Format": "json",
        "bad name": "x",
        "newline": "a\nb",
    }
    rid = await _put(qm, b"{}", tags)
    plain = await _put(qm, b"x")
    await _wait(lambda: len(_sink(qm)) == 2)
    await d.stop()
    by_rid = {r.request_id: r for r in seen}
    forwarded = {"uri": "u1", "Content-Type": "application/json", "X-Eas-Request-Format": "json"}
    assert by_rid[rid].headers == forwarded
    assert by_rid[rid].content_type == "application/json"
    assert by_rid[plain].headers == {} and by_rid[plain].content_type == "application/octet-stream"
    assert _sink(qm)[rid].tags["bad name"] == "x"  # every tag still reaches the result


def test_window_fills_batches() -> None:
    from gateway.config import BatchingConfig

    assert worker_capacity(_svc(workers=2)) == 4
    batched = ServiceConfig(
        name="b", processor="onnx", model="m.onnx", workers=2, batching=BatchingConfig(max_batch_size=8)
    )
    assert worker_capacity(batched) == 2 * 2 * 8  # a batch computing and the next one filling, per worker
    big = ServiceConfig(
        name="b", processor="onnx", model="m.onnx", workers=4, batching=BatchingConfig(max_batch_size=32)
    )
    assert worker_capacity(big) == big.max_pending  # the pool refuses more than max_pending


async def test_a_result_consumed_before_a_crash_is_not_written_again(tmp_path: Path) -> None:
    """The sink write is durable, a reader consumes the result, the gateway dies before the
    input commit: after the restart the input is redelivered and its work repeats, but the
    sink remembers the request id and takes no second result."""
    m = QueueManager([_svc()], str(tmp_path))
    await m.start()
    rid = await _put(m, b"x")
    _i, _r, dur = m.queue("asvc/sink").put(b"out:x", {"status": "200"}, rid)
    await dur
    recs, dur = m.queue("asvc/sink").get(0, 10, True, None, {})  # consumed by a reader
    await dur
    assert [r.rid for r in recs] == [rid]
    m.backend._ckpt_stop.set()
    m.backend._conn.close()  # kill -9: the input commit never happens
    m.backend.lock.release()  # as the kernel drops a killed process's flock

    m2 = QueueManager([_svc()], str(tmp_path))
    await m2.start()
    try:
        pool = FakePool(_echo)
        d = await _dispatcher(m2, pool)
        await _wait(lambda: m2.queue("asvc").length == 0)
        await d.stop()
        assert pool.calls == [rid]
        assert m2.queue("asvc/sink").length == 0
    finally:
        await m2.stop()


async def test_payloads_read_back_from_disk(tmp_path: Path) -> None:
    """With memory_bytes 0 every payload is on disk only: the dispatcher reads each input
    back, and its results are read back too."""
    svc = ServiceConfig(
        name="asvc", processor="onnx", model="m.onnx", async_=True, queue=QueueConfig(memory_bytes=0)
    )
    qm = QueueManager([svc], str(tmp_path))
    await qm.start()
    try:
        rids = [await _put(qm, f"x{i}".encode() * 1000) for i in range(20)]
        assert all(r.data is None for r in qm.queue("asvc").records.values())
        d = await _dispatcher(qm, FakePool(_echo), svc)
        await _wait(lambda: len(_sink(qm)) == 20 and qm.queue("asvc").length == 0)
        await d.stop()
        sink = _sink(qm)
        assert [qm.queue("asvc/sink").payload(sink[rid]) for rid in rids] == [
            b"out:" + f"x{i}".encode() * 1000 for i in range(20)
        ]
    finally:
        await qm.stop()
