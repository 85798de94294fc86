"""A three-step pipeline in the gateway vs the same three steps called one after another by the client.

Three onnx services (digits PCA features -> logistic regression -> top 3, the last written
with onnx.helper) and a pipeline service whose three steps call them. A client (this
process, core 1) drives both ways at a fixed concurrency in interleaved rounds against the
gateway and its workers (core 0), TF protobuf bodies throughout:

* pipeline: one call to the pipeline, which hands the tensors from step to step in the gateway;
* client chain: three calls, the client decoding each answer and encoding the next request.

Prints req/s and p50 of each, the throughput ratio pipeline / client chain (target >= 1.5),
and the pipeline's overhead per step in microseconds, two ways: in the gateway (the answer's
Server-Timing total less its steps, at concurrency 1) and in process (the runner over three
no-op steps less calling them directly). Last, the cost of moving a tensor to a step on a
worker process and back (an identity op with ``placement: process``, 1 to 64 MiB of float32),
in shared memory and in the message over the socket, in µs per MiB and in memcpys of the
same bytes.

    .venv/bin/python benchmarks/bench_pipeline.py [--rounds N] [--seconds S] [--concurrency C] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import PY, ROOT, Child, free_port, median, pin, wait_port

from eas_sdk.codecs.eas import decode_tf_response, encode_tf_request

PIXELS = np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 64)


def build_models(out: Path) -> dict[str, Path]:
    from onnx import TensorProto, helper, numpy_helper

    sys.path.insert(0, str(ROOT / "samples" / "pipelines"))
    import build_models as samples  # type: ignore[import-not-found]

    features, classifier = samples.build_digits(out)
    k = numpy_helper.from_array(np.array([3], dtype=np.int64), "k")
    graph = helper.make_graph(
        [helper.make_node("TopK", ["probabilities", "k"], ["values", "indices"], axis=-1)],
        "top3",
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, ["N", 3]),
        ],
        [k],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    top = out / "top3.onnx"
    top.write_bytes(model.SerializeToString())
    return {"features": features, "classify": classifier, "top": top}


def write_config(work: Path, models: dict[str, Path], port: int) -> Path:
    """The three services, and two pipelines of the same three steps: ``chain`` runs its own
    copies of the models in the gateway's threads, ``chain-workers`` calls the services."""
    svc = (
        "{name: %s, processor: onnx, placement: process, public: true, model: %s, workers: 1, "
        "max_pending: 4096}"
    )
    inputs = {"features": "pixels: request.pixels", "classify": "features: features.features",
              "top": "probabilities: classify.probabilities"}  # fmt: skip
    outputs = {"features": "features", "classify": "probabilities", "top": "indices"}
    lines = [
        "gateway:",
        f"  host: 127.0.0.1\n  port: {port}\n  access_log: false\n  data_dir: {work / 'data'}",
        "services:",
        *(f"  - {svc % (name, path)}" for name, path in models.items()),
    ]
    for pipeline, place in (
        ("chain", "model: {path}, placement: thread"),
        ("chain-workers", "service: {name}"),
    ):
        lines += [
            f"  - name: {pipeline}",
            "    processor: pipeline",
            "    public: true",
            "    max_pending: 4096",
            "    pipeline:",
            "      inputs: {pixels: {dtype: float32, shape: [-1, 64]}}",
            "      steps:",
            *(
                f"        - {{name: {name}, {place.format(path=path, name=name)}, inputs: {{{inputs[name]}}},"
                f" outputs: [{outputs[name]}]}}"
                for name, path in models.items()
            ),
            "      outputs: {indices: top.indices}",
        ]
    path = work / "services.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _outputs(body: bytes) -> dict[str, np.ndarray]:
    return {n: r.to_tensor(n).array for n, r in decode_tf_response(body).items()}


async def drive(call: Callable[[], Awaitable[None]], seconds: float, concurrency: int) -> tuple[float, float]:
    """``call`` from ``concurrency`` loops for ``seconds`` -> (calls/s, p50 latency in µs)."""
    stop = time.perf_counter() + seconds
    lat: list[float] = []

    async def loop() -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await call()
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return len(lat) / (time.perf_counter() - t0), statistics.median(lat) * 1e6


async def measure(url: str, rounds: int, seconds: float, concurrency: int) -> dict[str, Any]:
    import aiohttp

    headers = {"Content-Type": "application/octet-stream"}
    pipeline_body = encode_tf_request(None, {"pixels": PIXELS}, ["indices"])
    timing_overheads: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def call(service: str, body: bytes, extra: dict[str, str] | None = None) -> tuple[bytes, Any]:
            async with session.post(f"{url}/api/predict/{service}", data=body, headers=extra or headers) as r:
                data = await r.read()
                assert r.status == 200, data[:300]
                return data, r.headers

        async def pipeline() -> None:
            await call("chain", pipeline_body)

        async def pipeline_workers() -> None:
            await call("chain-workers", pipeline_body)

        async def chain() -> None:
            out, _ = await call("features", encode_tf_request(None, {"pixels": PIXELS}))
            feats = _outputs(out)["features"]
            out, _ = await call("classify", encode_tf_request(None, {"features": feats}, ["probabilities"]))
            probs = _outputs(out)["probabilities"]
            out, _ = await call("top", encode_tf_request(None, {"probabilities": probs}, ["indices"]))
            _outputs(out)

        async def timed() -> None:
            _, h = await call("chain", pipeline_body, {**headers, "X-Eas-Pipeline-Timings": "1"})
            parts = dict(p.split(";dur=") for p in h["Server-Timing"].split(", "))
            total = float(parts.pop("total"))
            timing_overheads.append((total - sum(map(float, parts.values()))) * 1000 / len(parts))

        # Both ways give the same answer; then a warm-up of each.
        out, _ = await call("chain", pipeline_body)
        via_pipeline = _outputs(out)["indices"]
        out, _ = await call("features", encode_tf_request(None, {"pixels": PIXELS}))
        out, _ = await call("classify", encode_tf_request(None, _outputs(out), ["probabilities"]))
        out, _ = await call("top", encode_tf_request(None, _outputs(out), ["indices"]))
        assert _outputs(out)["indices"].tolist() == via_pipeline.tolist()
        await drive(pipeline, 0.5, concurrency)
        await drive(chain, 0.5, concurrency)
        await drive(pipeline_workers, 0.5, concurrency)
        calls = {"pipeline": pipeline, "workers": pipeline_workers, "chain": chain}
        res: dict[str, list[tuple[float, float]]] = {k: [] for k in calls}
        ratios: dict[str, list[float]] = {"pipeline": [], "workers": []}
        for _ in range(rounds):
            for name, fn in calls.items():
                res[name].append(await drive(fn, seconds, concurrency))
            for name in ratios:  # each ratio within its round
                ratios[name].append(res[name][-1][0] / res["chain"][-1][0])
        c1 = {name: await drive(fn, 1.0, 1) for name, fn in calls.items()}
        await drive(timed, 1.0, 1)
    return {
        "res": res,
        "ratio": {k: median(v) for k, v in ratios.items()},
        "c1": c1,
        "overhead_us": median(timing_overheads),
    }


def runner_overhead_us(n: int = 20_000) -> float:
    """The runner's own cost per step: three no-op steps through it, less calling them directly."""
    from gateway.backends.pipelines.runner import CallContext, Runner, TransformStep
    from gateway.config import parse_config

    cast = {"transform": "cast", "args": {"dtype": "float32"}, "outputs": ["y"]}
    raw = {
        "services": [{"name": "p", "processor": "pipeline", "public": True, "pipeline": {
            "inputs": {"x": "float32"},
            "steps": [{"name": "a", "inputs": {"x": "request.x"}, **cast},
                      {"name": "b", "inputs": {"x": "a.y"}, **cast},
                      {"name": "c", "inputs": {"x": "b.y"}, **cast}],
            "outputs": {"y": "c.y"}}}]
    }  # fmt: skip
    spec = parse_config(raw).services[0].pipeline
    assert spec is not None
    execs = {s.name: TransformStep(s) for s in spec.steps}
    runner = Runner(spec, execs)
    x = np.zeros(4, dtype=np.float32)
    ctx = CallContext("bench", time.monotonic() + 3600)

    async def through_runner() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            await runner.run({"x": x}, ctx)
        return time.perf_counter() - t0

    async def direct() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            v: Any = x
            for s in spec.steps:
                v = (await execs[s.name].run({"x": v}, ctx))["y"]
        return time.perf_counter() - t0

    async def both() -> tuple[float, float]:
        await through_runner()
        await direct()
        return min([await through_runner() for _ in range(3)]), min([await direct() for _ in range(3)])

    runner_s, direct_s = asyncio.run(both())
    return (runner_s - direct_s) / n / 3 * 1e6


_IDENTITY_OP = "class Identity:\n    def preprocess(self, inputs):\n        return inputs\n"


async def _hop(work: Path, sizes_mb: tuple[int, ...], reps: int) -> dict[int, tuple[float, float, float]]:
    """A tensor's round trip through an op on a worker process of its own, as a pipeline step
    makes it (ModelCall over the worker IPC, values messages both ways): per size, the median
    round trip in µs per MiB with the array in shared memory, the same with it in the message
    (over the socket), and one memcpy of the same bytes."""
    from gateway.backends.pipelines.runner import CallContext, ModelCall
    from gateway.backends.pool import WorkerPool
    from gateway.codecs.shm import SHM_ENV, ShmArea
    from gateway.config import GatewayConfig, ServiceConfig

    op = work / "identity_op.py"
    op.write_text(_IDENTITY_OP)
    area = ShmArea.plan("bench-hop")
    assert area is not None and area.open(), "no /dev/shm"
    svc = ServiceConfig(
        name="hop", processor="op", entry=f"{op}:Identity", max_pending=64, timeout_ms=60_000,
        env={SHM_ENV: area.path},  # as a pipeline tells its op's workers
    )  # fmt: skip
    # The answer carries the whole array when it is not in shared memory: the largest size is
    # over the default limit on an answer (64 MiB), so the limit is raised as a user would.
    limit = 2 * max(sizes_mb) << 20
    gateway = GatewayConfig(health_interval_s=5.0, log_level="WARNING", max_response_bytes=limit)
    pool = WorkerPool(svc, gateway)
    await pool.start()
    out: dict[int, tuple[float, float, float]] = {}
    try:
        assert await pool.wait_ready(60), pool.snapshot()
        shared = ModelCall("hop", pool, ("x",), form="values", shm=area.path)
        inline = ModelCall("hop", pool, ("x",), form="values")
        ctx = CallContext("bench", time.monotonic() + 3600)
        for mb in sizes_mb:
            x = np.random.default_rng(mb).random(mb * (1 << 18), dtype=np.float32)  # mb MiB
            copy = np.empty_like(x)
            for call in (shared, inline):
                assert np.array_equal((await call({"x": x}, ctx))["x"], x)
            figures: list[list[float]] = [[], [], []]
            for _ in range(reps):
                for i, call in enumerate((shared, inline)):
                    t0 = time.perf_counter()
                    await call({"x": x}, ctx)
                    figures[i].append((time.perf_counter() - t0) * 1e6 / mb)
                t0 = time.perf_counter()
                np.copyto(copy, x)
                figures[2].append((time.perf_counter() - t0) * 1e6 / mb)
            out[mb] = (
                statistics.median(figures[0]),
                statistics.median(figures[1]),
                statistics.median(figures[2]),
            )
    finally:
        await pool.stop(2)
        area.close()
    return out


def hop_figures(work: Path, quick: bool) -> dict[int, tuple[float, float, float]]:
    sizes, reps = ((1, 16), 5) if quick else ((1, 16, 64), 15)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is part of the gateway extra
        return asyncio.run(_hop(work, sizes, reps))
    return uvloop.run(_hop(work, sizes, reps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="1 round x 1.5 s (smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 1.5
    work = Path(tempfile.mkdtemp(prefix="easkit-bench-pipeline-"))
    (work / "models").mkdir()
    models = build_models(work / "models")
    port = free_port()
    cfg = write_config(work, models, port)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with Child(
        [*pin(0), PY, "-m", "gateway", "serve", "--config", str(cfg), "--log-level", "WARNING"], env=env
    ) as gw:
        wait_port(port)
        import urllib.request

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            raise SystemExit(f"gateway not ready:\n{gw.output()[-3000:]}")
        if pin(1):
            os.sched_setaffinity(0, {1})
        out = asyncio.run(measure(f"http://127.0.0.1:{port}", args.rounds, args.seconds, args.concurrency))
    rps = {k: median([r for r, _ in v]) for k, v in out["res"].items()}
    p50 = {k: median([p for _, p in v]) for k, v in out["res"].items()}
    c, r, s = args.concurrency, args.rounds, args.seconds
    print(f"three-step pipeline vs the client calling the three services, concurrency {c}, {r} x {s:g} s:")
    print(f"  pipeline, models in its threads  : {rps['pipeline']:7.0f} req/s  p50 {p50['pipeline']:7.0f} us")
    print(f"  pipeline, steps on the services  : {rps['workers']:7.0f} req/s  p50 {p50['workers']:7.0f} us")
    print(f"  client chain (3 calls)           : {rps['chain']:7.0f} req/s  p50 {p50['chain']:7.0f} us")
    ratio = out["ratio"]
    print(f"  throughput ratio pipeline / client chain: {ratio['pipeline']:.2f}  (target >= 1.5)")
    print(f"  throughput ratio pipeline on the services / client chain: {ratio['workers']:.2f}")
    c1 = {k: f"{v[1]:.0f} us" for k, v in out["c1"].items()}
    print(f"  concurrency 1 p50: pipeline {c1['pipeline']}, on the services {c1['workers']}, ", end="")
    print(f"chain {c1['chain']}")
    print(f"  pipeline overhead per step in the gateway (Server-Timing, c=1): {out['overhead_us']:.1f} us")
    print(f"  runner overhead per step in process (no-op steps): {runner_overhead_us():.1f} us")
    print("  a float32 tensor's round trip to an op on its own worker process, us per MiB:")
    for mb, (shared, inline, copy) in hop_figures(work, args.quick).items():
        print(f"    {mb:3d} MiB: shared memory {shared:6.0f} ({shared / copy:4.1f} memcpys), ", end="")
        print(f"in the message {inline:6.0f} ({inline / copy:4.1f} memcpys); one memcpy {copy:4.0f}")


if __name__ == "__main__":
    main()
