"""The dispatcher's finisher against the real queue stores (SQLite, and Redis where the backend
matters): results written and inputs committed many records per store call, with the
guarantees of one record at a time."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.config import QueueConfig, ServiceConfig
from gateway.queue.dispatcher import FAST_PER_WORKER, worker_capacity
from gateway.queue.manager import QueueManager
from gateway.queue.redis_backend import RedisBackend
from gateway.queue.store import Queue
from tests.gateway.queue.conftest import async_service as _svc
from tests.gateway.queue.test_backend_conformance import LEASE_S, Store
from tests.gateway.queue.test_dispatcher import (
    FakePool,
    Req,
    Resp,
    _dispatcher,
    _echo,
    _put,
    _sink,
    _wait,
)


@dataclass
class GatedPool(FakePool):
    """Holds every call until ``gate`` is set, so that the records it holds finish together."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def dispatch(self, req: Req, timeout: float) -> Resp:
        self.calls.append(req.request_id)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            await self.gate.wait()
            out = self.reply(req.body)
            assert isinstance(out, Resp)
            return out
        finally:
            self.inflight -= 1


REDIS_DB = 3  # flushed before each test that uses it


@pytest.fixture(params=["sqlite", "redis"])
def store_kw(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The queue block's store settings: the embedded SQLite store, or a real redis-server."""
    if request.param == "sqlite":
        return {}
    redis = request.getfixturevalue("redis_server")
    with redis.client(REDIS_DB) as c:
        c.flushdb()
    return {"backend": redis.url(REDIS_DB), "owner_lease_s": LEASE_S}


def _async_svc(store_kw: dict[str, Any], workers: int = 2) -> ServiceConfig:
    return ServiceConfig(
        name="asvc",
        processor="onnx",
        model="m.onnx",
        workers=workers,
        async_=True,
        queue=QueueConfig(**store_kw),
    )


async def _crash(m: QueueManager) -> None:
    """Stop writing without a clean stop, as a kill -9 would."""
    if isinstance(m.backend, RedisBackend):
        await Store.crash_redis(m)
        return
    m.backend._ckpt_stop.set()
    m.backend._conn.close()
    m.backend.lock.release()  # as the kernel drops a killed process's flock


def _count_calls(monkeypatch: pytest.MonkeyPatch, q: Queue, name: str) -> list[Any]:
    """The arguments of every call of ``q.<name>`` (a put_many's items, a commit's indexes)."""
    seen: list[Any] = []
    real = getattr(q, name)

    def spy(*args: Any) -> Any:
        seen.append(args[-1])
        return real(*args)

    monkeypatch.setattr(q, name, spy)
    return seen


async def test_records_finishing_together_are_one_sink_write_and_one_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_kw: dict[str, Any]
) -> None:
    svc = _async_svc(store_kw, workers=4)
    qm = QueueManager([svc], str(tmp_path))
    await qm.start()
    try:
        pool = GatedPool(_echo)
        puts = _count_calls(monkeypatch, qm.queue("asvc/sink"), "put_many")
        commits = _count_calls(monkeypatch, qm.queue("asvc"), "commit")
        d = await _dispatcher(qm, pool, svc)
        rids = [await _put(qm, f"x{i}".encode(), {"uri": f"u{i}"}) for i in range(worker_capacity(svc))]
        await _wait(lambda: pool.inflight == len(rids))  # every slot taken, nothing finished
        writes = qm.backend.ops  # type: ignore[attr-defined]
        pool.gate.set()
        await _wait(lambda: qm.queue("asvc").length == 0 and not d.snapshot()["inflight"])
        await d.stop()
        assert [len(items) for items in puts] == [len(rids)]
        assert [sorted(idxs) for idxs in commits] == [list(range(1, len(rids) + 1))]
        assert qm.backend.ops == writes + 2  # type: ignore[attr-defined]  # one sink write, one commit
        sink = _sink(qm)
        assert [sink[rid].data for rid in rids] == [f"out:x{i}".encode() for i in range(len(rids))]
        assert [sink[rid].tags["uri"] for rid in rids] == [f"u{i}" for i in range(len(rids))]
        assert d.snapshot()["results_total"] == len(rids)
    finally:
        await qm.stop()


async def test_a_crash_between_the_sink_write_and_the_commit_redelivers_without_loss(
    tmp_path: Path, store_kw: dict[str, Any]
) -> None:
    """The gateway dies once a batch of results is durable in the sink and before its inputs are
    committed: after the restart every input is delivered again, the work repeats, and the
    sink keeps the first result of each record that had one and gets one for every other."""
    svc = _async_svc(store_kw)
    m = QueueManager([svc], str(tmp_path))
    await m.start()
    rids = [await _put(m, f"r{i}".encode()) for i in range(12)]
    crashed = asyncio.Event()
    pool = FakePool(lambda b: Resp(200, b"run1:" + b))
    d = await _dispatcher(m, pool, svc)

    async def crash(done: list[Any]) -> None:
        await _crash(m)  # kill -9: no commit reaches the store
        crashed.set()
        await asyncio.Event().wait()

    d.finisher._commit = crash  # type: ignore[method-assign]
    await _wait(crashed.is_set)
    first = {r.rid: r.data for r in m.queue("asvc/sink").records.values()}
    assert first and set(first) <= set(rids)
    await d.stop(timeout=0)

    m2 = QueueManager([svc], str(tmp_path))
    await m2.start()
    try:
        assert sorted(r.rid for r in m2.queue("asvc").records.values()) == sorted(rids)  # none lost
        pool2 = FakePool(lambda b: Resp(200, b"run2:" + b))
        d2 = await _dispatcher(m2, pool2, svc)
        await _wait(lambda: m2.queue("asvc").length == 0 and not d2.snapshot()["inflight"])
        await d2.stop()
        assert sorted(pool2.calls) == sorted(rids)  # the work repeats ...
        sink = list(m2.queue("asvc/sink").records.values())
        assert sorted(r.rid for r in sink) == sorted(rids)  # ... one result per record
        results = {r.rid: m2.queue("asvc/sink").payload(r) for r in sink}
        assert results == {rid: first.get(rid, f"run2:r{i}".encode()) for i, rid in enumerate(rids)}
    finally:
        await m2.stop()


async def test_each_record_of_a_batch_gets_its_own_result_errors_included(tmp_path: Path) -> None:
    """Processor errors, an empty error reply, a 200 without a body and an answer too large for
    the sink, finishing together with plain results: each gets what it would alone."""
    svc = ServiceConfig(
        name="asvc",
        processor="onnx",
        model="m.onnx",
        workers=4,
        async_=True,
        queue=QueueConfig(max_payload_bytes=1024),
    )
    qm = QueueManager([svc], str(tmp_path))
    await qm.start()
    try:
        replies = {
            b"ok": Resp(200, b"fine"),
            b"bad": Resp(400, b'{"code":"InvalidInput"}'),
            b"fail": Resp(500, b""),
            b"skip": Resp(200, b""),
            b"huge": Resp(200, b"y" * 2048),
            b"ok2": Resp(200, b"fine2"),
        }
        pool = GatedPool(lambda b: replies[b])
        d = await _dispatcher(qm, pool, svc)
        rids = {k: await _put(qm, k) for k in replies}
        await _wait(lambda: pool.inflight == len(replies))
        pool.gate.set()
        await _wait(lambda: qm.queue("asvc").length == 0 and not d.snapshot()["inflight"])
        await d.stop()
        sink = _sink(qm)
        assert rids[b"skip"] not in sink and len(sink) == 5
        got = {k: (sink[rid].tags["status"], sink[rid].data) for k, rid in rids.items() if k != b"skip"}
        assert got[b"ok"] == ("200", b"fine") and got[b"ok2"] == ("200", b"fine2")
        assert got[b"bad"] == ("400", b'{"code":"InvalidInput"}')
        assert got[b"fail"][0] == "500" and b"empty body" in got[b"fail"][1]
        assert got[b"huge"][0] == "413" and "maxPayloadBytes" in json.loads(got[b"huge"][1])["error"]
        figures = d.snapshot()
        assert (figures["results_total"], figures["errors_total"], figures["empty_total"]) == (5, 3, 1)
    finally:
        await qm.stop()


async def test_a_refused_commit_is_retried_and_writes_no_second_result(
    qm: QueueManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses the inputs' commit (a read-only disk) after the results are durable:
    the records stay with the dispatcher, the commit is tried again once the disk is back,
    and the sink still holds one result per record."""
    inq = qm.queue("asvc")
    real_commit = inq.commit
    refused: list[list[int]] = []

    def read_only_once(gid: str, idxs: list[int]) -> Any:
        if not refused:
            refused.append(list(idxs))
            qm.backend._conn.execute("PRAGMA query_only=1")
            asyncio.get_running_loop().call_later(0.05, qm.backend._conn.execute, "PRAGMA query_only=0")
        return real_commit(gid, idxs)

    rids = [await _put(qm, f"c{i}".encode()) for i in range(6)]  # (before the disk goes read-only)
    monkeypatch.setattr(inq, "commit", read_only_once)
    pool = FakePool(_echo)
    d = await _dispatcher(qm, pool)
    await _wait(lambda: inq.length == 0 and not d.snapshot()["inflight"])
    await d.stop()
    assert refused and qm.backend.errors  # the commit was refused, then tried again
    assert sorted(pool.calls) == sorted(rids)  # no record was inferred twice
    sink = list(qm.queue("asvc/sink").records.values())
    assert sorted(r.rid for r in sink) == sorted(rids)


async def test_the_window_grows_for_a_quick_model_only(tmp_path: Path) -> None:
    """Workers that report a short compute time get up to FAST_PER_WORKER records each; a slow
    model's workers keep one computing and one waiting."""
    svc = _svc(workers=2)
    assert worker_capacity(svc) == 4
    assert worker_capacity(svc, 0.5) == 4  # 0.5 s per record: no deeper
    assert worker_capacity(svc, 0.0005) == 2 * 4  # as many as one computes in 2 ms
    assert worker_capacity(svc, 0.00001) == 2 * FAST_PER_WORKER
    qm = QueueManager([svc], str(tmp_path))
    await qm.start()
    try:
        for i in range(40):
            await _put(qm, f"q{i}".encode())
        # The first replies tell their compute time: from then on more go out at once.
        quick = FakePool(lambda b: Resp(200, b"q", compute_us=20), delay=0.001)
        d = await _dispatcher(qm, quick, svc)
        await _wait(lambda: qm.queue("asvc").length == 0 and not d.snapshot()["inflight"])
        await d.stop()
        assert d.window == 2 * FAST_PER_WORKER and 4 < quick.max_inflight <= d.window
        assert len(_sink(qm)) == 40
    finally:
        await qm.stop()


async def test_the_window_shrinks_back_when_the_model_slows_down(qm: QueueManager) -> None:
    started: list[int] = []  # records at the pool when each call starts (itself included)

    class Recording(FakePool):
        async def dispatch(self, req: Req, timeout: float) -> Resp:
            started.append(self.inflight + 1)
            return await super().dispatch(req, timeout)

    # Quick for the first 20 records, then 1 s of compute per record (as the worker reports).
    pool = Recording(lambda b: Resp(200, b"r", compute_us=20 if int(b[1:]) < 20 else 1_000_000), delay=0.001)
    for i in range(60):
        await _put(qm, f"r{i}".encode())
    d = await _dispatcher(qm, pool)
    await _wait(lambda: qm.queue("asvc").length == 0 and not d.snapshot()["inflight"])
    await d.stop()
    assert max(started[:20]) > 4  # deeper while quick ...
    assert d.window == 4 and max(started[-10:]) <= 4  # ... and back to two per worker
