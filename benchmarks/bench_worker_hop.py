"""Gateway -> worker hop: framed unix-socket RPC (WorkerPool.dispatch) vs HTTP to the same worker.

Starts one worker (digits.onnx, TF request of 1x64 floats, or the echo processor) and,
from this process playing the gateway, drives it at a fixed concurrency two ways,
alternating rounds so both see the same machine load:

* rpc:  WorkerPool.dispatch over 2 persistent pipelined unix-socket connections;
* http: aiohttp ClientSession (keep-alive pool) POSTing to the worker's own HTTP port.

Prints requests/s for each and the ratio rpc/http.

Then, in this process, the worker's own hand-over between its event loop and its compute
thread (gateway.worker.compute, gateway.worker.direct), figures the unit tests only check
the direction of:

* wake-ups of the event loop per answer when 60 short runs (100 µs) are queued at once:
  answers finished together are handed over together (goal <= 0.5: at most one wake-up per
  two answers; one per answer without it);
* the share of direct calls the worker runs inline (in its event loop, digits.onnx) when
  they come one per turn of the loop, and when 16 arrive in each turn.

    .venv/bin/python benchmarks/bench_worker_hop.py [--seconds 3] [--concurrency 16] [--echo]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks._harness import Target, report_targets  # noqa: E402
from eas_sdk.codecs import eas  # noqa: E402
from gateway.backends.pool import WorkerPool  # noqa: E402
from gateway.config import GatewayConfig, ServiceConfig  # noqa: E402
from gateway.core.calls import WorkerRequest, WorkerResponse  # noqa: E402
from gateway.worker.compute import ComputeQueue  # noqa: E402
from gateway.worker.direct import ComputeBackend  # noqa: E402
from gateway.worker.processors.base import Processor  # noqa: E402
from gateway.worker.processors.registry import create_processor  # noqa: E402


def _tf_body() -> bytes:
    from eas_sdk._proto import tf_predict_pb2

    req = tf_predict_pb2.PredictRequest(signature_name="predict")
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    req.inputs["input"].dtype = tf_predict_pb2.DT_FLOAT
    req.inputs["input"].array_shape.dim.extend(x.shape)
    req.inputs["input"].float_val.extend(x.ravel().tolist())
    return req.SerializeToString()


async def _drive(call, seconds: float, concurrency: int) -> tuple[float, float]:
    """Run `call` from `concurrency` loops for `seconds`; return (req/s, p50 latency µs)."""
    stop = time.perf_counter() + seconds
    lat: list[float] = []

    async def loop() -> None:
        n = 0
        while n < 1_000_000 and time.perf_counter() < stop:
            t0 = time.perf_counter()
            await call()
            lat.append(time.perf_counter() - t0)
            n += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return len(lat) / elapsed, statistics.median(lat) * 1e6


class _Short(Processor):
    """A run of about 100 µs (a sleep: the compute thread lets go of the GIL, like a model)."""

    def __init__(self) -> None:
        super().__init__(ServiceConfig(name="short", processor="python"))

    def load(self) -> None:
        pass

    def handle(self, req: WorkerRequest) -> WorkerResponse:
        time.sleep(0.0001)
        return WorkerResponse(200, b"ok")


async def _wakeups_per_answer(queued: int = 60) -> float:
    """``queued`` short runs submitted at once; -> wake-ups of the event loop per answer."""
    compute = ComputeQueue(asyncio.get_running_loop(), _Short())
    wakes = 0
    deliver = compute._deliver

    def counted() -> None:
        nonlocal wakes
        wakes += 1
        deliver()

    compute._deliver = counted  # type: ignore[method-assign]
    answered = 0
    all_in = asyncio.get_running_loop().create_future()

    def done(resp: WorkerResponse | None) -> None:
        nonlocal answered
        answered += 1
        if answered == queued:
            all_in.set_result(None)

    try:
        for _ in range(queued):
            compute.submit(WorkerRequest(b""), done, inline=False)
        await asyncio.wait_for(all_in, 30)
    finally:
        compute.shutdown()
    return wakes / queued


async def _inline_share(model: str, per_turn: int, turns: int) -> float:
    """Direct calls through the worker's ComputeBackend, ``per_turn`` of them in each turn of
    the event loop; -> the share run inline."""
    proc = create_processor(ServiceConfig(name="digits", processor="onnx", model=model))
    proc.load()
    compute = ComputeQueue(asyncio.get_running_loop(), proc)
    backend = ComputeBackend(compute)
    body = _tf_body()
    try:
        for _ in range(turns):
            calls = [backend.dispatch(WorkerRequest(body), 5.0) for _ in range(per_turn)]
            answers = await asyncio.gather(*calls)
            assert all(a.status == 200 for a in answers), answers[0].body
            await asyncio.sleep(0)  # the turn ends: the next calls come in a turn of their own
    finally:
        compute.shutdown()
    return compute.inlined / compute.runs


async def handover(rounds: int) -> list[Target]:
    """The compute hand-over figures (see the module doc), medians over ``rounds``."""
    sys.path.insert(0, str(ROOT / "samples"))
    from build_models import build_all

    model = str(build_all()["digits"])
    wakes = statistics.median([await _wakeups_per_answer() for _ in range(max(3, rounds))])
    alone = statistics.median([await _inline_share(model, 1, 200) for _ in range(rounds)])
    burst = statistics.median([await _inline_share(model, 16, 20) for _ in range(rounds)])
    print("compute hand-over (in process):")
    print(f"  wake-ups per answer, 60 queued 100 us runs: {wakes:.2f}")
    print(f"  direct calls run inline: {alone:.0%} one per turn, {burst:.0%} 16 per turn")
    return [
        Target("compute hand-over: wake-ups per answer", wakes, "<=", 0.5),
        Target("direct calls inline, one per turn", alone * 100, "", None, "%"),
        Target("direct calls inline, 16 per turn", burst * 100, "", None, "%"),
    ]


async def main(seconds: float, concurrency: int, echo: bool, rounds: int) -> None:
    if echo:
        svc = ServiceConfig(
            name="bench", processor="python", entry=f"{ROOT}/samples/processors/echo.py:EchoProcessor",
            max_pending=4096, timeout_ms=10_000,
        )  # fmt: skip
        body = b"x" * 256
    else:
        sys.path.insert(0, str(ROOT / "samples"))
        from build_models import build_all

        svc = ServiceConfig(
            name="bench",
            processor="onnx",
            model=str(build_all()["digits"]),
            max_pending=4096,
            timeout_ms=10_000,
        )
        body = _tf_body()
    pool = WorkerPool(svc, GatewayConfig(health_interval_s=1.0, log_level="WARNING"))
    await pool.start()
    try:
        assert await pool.wait_ready(60), pool.snapshot()
        host, port = pool.ready_endpoints()[0]
        url = f"http://{host}:{port}/api/predict/bench"
        check = await pool.dispatch(WorkerRequest(body), 5)
        assert check.status == 200, check.body
        if not echo:
            eas.decode_request(body)  # sanity: a real TF request

        async def rpc() -> None:
            resp = await pool.dispatch(WorkerRequest(body), 10)
            assert resp.status == 200

        connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def http() -> None:
                async with session.post(url, data=body) as r:
                    await r.read()
                    assert r.status == 200

            await _drive(rpc, 0.5, concurrency)  # warm-up both paths
            await _drive(http, 0.5, concurrency)
            res: dict[str, list[tuple[float, float]]] = {"rpc": [], "http": []}
            for _ in range(rounds):
                res["rpc"].append(await _drive(rpc, seconds, concurrency))
                res["http"].append(await _drive(http, seconds, concurrency))
            c1_rpc = await _drive(rpc, 1.0, 1)
            c1_http = await _drive(http, 1.0, 1)
    finally:
        await pool.stop(2)
    rps = {k: statistics.median(r for r, _ in v) for k, v in res.items()}
    p50 = {k: statistics.median(p for _, p in v) for k, v in res.items()}
    what = "echo 256 B" if echo else "digits.onnx, TF 1x64 float"
    print(f"worker hop ({what}), concurrency {concurrency}, {rounds} x {seconds:g} s rounds, median:")
    print(f"  rpc  (unix-socket framed RPC): {rps['rpc']:8.0f} req/s  p50 {p50['rpc']:6.0f} us")
    print(f"  http (aiohttp ClientSession) : {rps['http']:8.0f} req/s  p50 {p50['http']:6.0f} us")
    print(f"  ratio rpc/http: {rps['rpc'] / rps['http']:.2f}")
    print(f"  concurrency 1 p50: rpc {c1_rpc[1]:.0f} us, http {c1_http[1]:.0f} us")
    inproc = await handover(rounds)
    ok = report_targets(
        "bench_worker_hop",
        [
            Target(
                f"worker hop: rpc / http throughput (c={concurrency})",
                rps["rpc"] / rps["http"],
                "",
                None,
                "x",
            ),
            *inproc,
        ],
    )
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--echo", action="store_true")
    ap.add_argument("--quick", action="store_true", help="1 round x 1 s (smoke run)")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.seconds = 1, 1.0
    try:
        import uvloop
    except ImportError:
        asyncio.run(main(a.seconds, a.concurrency, a.echo, a.rounds))
    else:
        uvloop.run(main(a.seconds, a.concurrency, a.echo, a.rounds))
