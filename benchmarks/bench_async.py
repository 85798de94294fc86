"""Asynchronous inference throughput against synchronous predict, same model and worker count.

One gateway serves the digits model twice with the same number of workers: ``dsync``
(synchronous) and ``dasync`` (``async: true``). Per round:

* sync:  N requests POSTed to /api/predict/dsync by C concurrent connections;
  throughput = N / (first send -> last answer);
* async: N records PUT to the input queue /api/predict/dasync by C concurrent
  connections while one watcher (auto_commit) reads the sink; throughput =
  N / (first put -> last result received).

Rounds alternate sync and async; the ratio is taken within each round and the median
over rounds is printed (async/sync; < 1 is the cost of durability on top of the same
inference: per record the input put and, in batches of what finished together, the result
written to the sink and the input committed; the sink watcher's commits; goal >= 0.8).

Usage: python benchmarks/bench_async.py [--records N] [--rounds R] [--workers W] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._harness import Target, report_targets

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "samples" / "models" / "digits.onnx"


def tf_bodies(n: int) -> list[bytes]:
    from eas_sdk._proto import tf_predict_pb2 as tf

    rows = np.random.default_rng(0).random((n, 64), dtype=np.float32)
    out = []
    for row in rows:
        req = tf.PredictRequest(signature_name="predict")
        arr = req.inputs["input"]
        arr.dtype = tf.DT_FLOAT
        arr.array_shape.dim.extend([1, 64])
        arr.float_val.extend(row.tolist())
        out.append(req.SerializeToString())
    return out


class Gateway:
    def __init__(self, workdir: Path, workers: int) -> None:
        import yaml

        cfg = {
            "gateway": {"data_dir": str(workdir / "data"), "access_log": False},
            "services": [
                {
                    "name": "dsync",
                    "processor": "onnx",
                    "placement": "process",
                    "model": str(MODEL),
                    "workers": workers,
                    "public": True,
                },
                {
                    "name": "dasync",
                    "processor": "onnx",
                    "placement": "process",
                    "model": str(MODEL),
                    "workers": workers,
                    "async": True,
                    "public": True,
                },
            ],
        }
        path = workdir / "bench_async.yaml"
        path.write_text(yaml.safe_dump(cfg))
        port_file = workdir / "port"
        self.log = (workdir / "gateway.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--host", "127.0.0.1",
             "--port", "0", "--port-file", str(port_file), "--log-level", "WARNING"],
            cwd=ROOT, stdout=self.log, stderr=self.log, start_new_session=True,
            env={**os.environ, "EASGW_LOOPBACK_ONLY": "1"},
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start; see {workdir / 'gateway.log'}")
            time.sleep(0.05)
        self.endpoint = port_file.read_text().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()


async def wait_ready(endpoint: str, timeout: float = 60.0) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(f"http://{endpoint}/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError("gateway not ready")


async def _post_all(endpoint: str, path: str, bodies: list[bytes], conns: int) -> float:
    """POST every body with ``conns`` concurrent connections; returns the start time."""
    import aiohttp

    it = iter(bodies)
    start = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=conns)
    async with aiohttp.ClientSession(connector=connector) as s:

        async def worker() -> None:
            for body in it:
                async with s.post(f"http://{endpoint}{path}", data=body) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{path}: HTTP {r.status}")

        await asyncio.gather(*(worker() for _ in range(conns)))
    return start


async def run_sync(endpoint: str, bodies: list[bytes], conns: int) -> float:
    start = await _post_all(endpoint, "/api/predict/dsync", bodies, conns)
    return len(bodies) / (time.perf_counter() - start)


async def run_async(endpoint: str, bodies: list[bytes], conns: int) -> float:
    from eas_sdk import AsyncQueueClient

    sink = AsyncQueueClient(endpoint, "dasync/sink")
    sink.init(uid="bench")
    got = 0
    done = asyncio.Event()
    watcher = sink.watch(0, 1000, auto_commit=True)
    end = 0.0

    async def collect() -> None:
        nonlocal got, end
        async for frame in watcher:
            if frame.tags.get("status") != "200":
                raise RuntimeError(f"async result with status {frame.tags.get('status')}")
            got += 1
            if got == len(bodies):
                end = time.perf_counter()
                done.set()
                return

    task = asyncio.create_task(collect())
    await asyncio.sleep(0.2)  # the watcher is connected before the first put
    start = await _post_all(endpoint, "/api/predict/dasync", bodies, conns)
    try:
        await asyncio.wait_for(done.wait(), 120)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await watcher.close()
        await sink.close()
    return len(bodies) / (end - start)


async def main_async(args: argparse.Namespace) -> None:
    bodies = tf_bodies(args.records)
    with tempfile.TemporaryDirectory(prefix="bench_async_") as tmp:
        gw = Gateway(Path(tmp), args.workers)
        try:
            await wait_ready(gw.endpoint)
            await run_sync(gw.endpoint, bodies[:200], args.connections)  # warm-up
            await run_async(gw.endpoint, bodies[:200], args.connections)
            ratios, syncs, asyncs = [], [], []
            for r in range(args.rounds):
                s = await run_sync(gw.endpoint, bodies, args.connections)
                a = await run_async(gw.endpoint, bodies, args.connections)
                syncs.append(s)
                asyncs.append(a)
                ratios.append(a / s)
                print(f"round {r + 1}: sync {s:8.0f} req/s   async {a:8.0f} records/s   ratio {a / s:.2f}")
        finally:
            gw.stop()
    med = sorted(ratios)[len(ratios) // 2]
    print(
        f"\n{args.records} records, {args.workers} worker(s), {args.connections} connections, "
        f"{args.rounds} round(s)\n"
        f"sync  predict : {sorted(syncs)[len(syncs) // 2]:8.0f} req/s (median)\n"
        f"async put->result: {sorted(asyncs)[len(asyncs) // 2]:8.0f} records/s (median)\n"
        f"async/sync throughput ratio: {med:.2f}"
    )
    report_targets(
        "bench_async", [Target("async: put->result / sync predict throughput", med, ">=", 0.8, "x")]
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="1 round of 1,000 records (< 30 s)")
    args = ap.parse_args()
    if args.quick:
        args.records, args.rounds = 1000, 1
    if not MODEL.exists():
        sys.path.insert(0, str(ROOT / "samples"))
        from build_models import build_all

        build_all()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
