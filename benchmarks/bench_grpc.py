"""V2 gRPC inference against the EAS TFRequest path, side by side in one run.

One gateway (pinned to core 0 with its worker) serves a small real ONNX model, built here
with ``onnx.helper``: a 1x3x224x224 float32 image in, global average pooling and a 3->10
linear layer, ``logits`` out. Its gRPC endpoint is on. In each round, for ``--seconds``
each, C concurrent callers in one asyncio loop (this process, on core 1) call it:

* ``eas``:  ``AsyncPredictClient.predict(TFRequest)`` with the image, as an EAS user does
  (the tensor is encoded on every call);
* ``grpc``: ``ModelInfer`` with the image in ``raw_input_contents`` over ``grpc.aio`` with
  the generated stub (the request is built on every call), the answer read into numpy.

Both answers are checked against ONNX Runtime before timing. Rounds alternate the two;
the ratio grpc/eas is taken within each round and the median over rounds is printed,
with the gateway's and worker's CPU time per call. Target: gRPC's throughput at least
1/1.5 of the EAS path's (ratio >= 0.67); exit status 1 if missed.

Usage: python benchmarks/bench_grpc.py [--rounds N] [--seconds S] [--connections C] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import NCPU, Child, cpu_seconds, free_port, median, quick_rounds, round_options, tree_pids
from _harness import start_gateway as harness_start_gateway

TOKEN = "bench-grpc-token-7d2e9c4b1a"
SHAPE = (1, 3, 224, 224)
TARGET = 1 / 1.5


def build_model(path: Path) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((3, 10)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("Gemm", ["flat", "w", "b"], ["logits"]),
        ],
        "pool_linear",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [None, 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 10])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    return path


def start_gateway(work: Path, model: Path, grpc_port: int) -> tuple[Child, str]:
    cfg = work / "services.yaml"
    cfg.write_text(
        "gateway:\n  host: 127.0.0.1\n  access_log: false\n"
        f"  data_dir: {work / 'data'}\n  grpc_port: {grpc_port}\n"
        "services:\n"
        f"  - name: pool\n    token: {TOKEN}\n    processor: onnx\n    placement: process\n"
        f"    model: {model}\n    workers: 1\n"
    )
    env = dict(os.environ, PYTHONUNBUFFERED="1", EASGW_LOG_LEVEL="WARNING")
    return harness_start_gateway(cfg, env)


async def drive(call: Callable[[], Awaitable[np.ndarray]], conns: int, seconds: float) -> float:
    """Calls per second from ``conns`` concurrent callers over ``seconds``."""
    count = 0
    stop = time.perf_counter() + seconds

    async def caller() -> None:
        nonlocal count
        while time.perf_counter() < stop:
            await call()
            count += 1

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(conns)))
    return count / (time.perf_counter() - start)


async def run(args: argparse.Namespace) -> int:
    import grpc
    import onnxruntime as ort

    from eas_sdk import AsyncPredictClient, TFRequest
    from gateway._proto import grpc_service_pb2 as pb
    from gateway._proto import grpc_service_pb2_grpc as pb_grpc

    work = Path(tempfile.mkdtemp(prefix="easkit-bench-grpc-"))
    model = build_model(work / "pool_linear.onnx")
    image = np.random.default_rng(1).random(SHAPE, dtype=np.float32)
    (want,) = ort.InferenceSession(str(model)).run(None, {"image": image})
    grpc_port = free_port()
    gateway, endpoint = start_gateway(work, model, grpc_port)
    auth = (("authorization", f"Bearer {TOKEN}"),)
    try:
        async with (
            AsyncPredictClient(endpoint, "pool", token=TOKEN, max_connection_count=args.connections) as eas,
            grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
        ):
            stub = pb_grpc.GRPCInferenceServiceStub(channel)

            async def eas_call() -> np.ndarray:
                req = TFRequest("serving_default")
                req.add_feed("image", list(SHAPE), TFRequest.DT_FLOAT, image)
                return (await eas.predict(req)).to_numpy("logits")

            async def grpc_call() -> np.ndarray:
                req = pb.ModelInferRequest(model_name="pool")
                req.inputs.add(name="image", datatype="FP32", shape=SHAPE)
                req.raw_input_contents.append(image.tobytes())
                resp = await stub.ModelInfer(req, metadata=auth, timeout=30)
                out = resp.outputs[0]
                return np.frombuffer(resp.raw_output_contents[0], "<f4").reshape(tuple(out.shape))

            calls = {"eas": eas_call, "grpc": grpc_call}
            for name, call in calls.items():  # correct answers first, and a warm-up
                np.testing.assert_allclose(await call(), want, rtol=1e-5, err_msg=name)
                await drive(call, args.connections, 1.0)
            pids = tree_pids(gateway.pid)
            rows: dict[str, list[tuple[float, float]]] = {k: [] for k in calls}
            ratios = []
            for rnd in range(args.rounds):
                rps = {}
                for name, call in calls.items():
                    cpu0 = cpu_seconds(pids)
                    t0 = time.perf_counter()
                    rps[name] = await drive(call, args.connections, args.seconds)
                    calls_made = rps[name] * (time.perf_counter() - t0)
                    cpu_us = (cpu_seconds(pids) - cpu0) * 1e6 / max(calls_made, 1)
                    rows[name].append((rps[name], cpu_us))
                ratios.append(rps["grpc"] / rps["eas"])
                print(
                    f"round {rnd + 1}: eas {rps['eas']:.0f} req/s, grpc {rps['grpc']:.0f} req/s, "
                    f"grpc/eas {ratios[-1]:.2f}",
                    flush=True,
                )
    finally:
        gateway.stop()

    print(
        f"\n1x3x224x224 FP32 -> 10 logits, c={args.connections}, {args.rounds} round(s) x {args.seconds:g} s"
    )
    print(f"{'path':<6} {'req/s':>8} {'server CPU us/call':>19}")
    for name, values in rows.items():
        print(f"{name:<6} {median([v[0] for v in values]):>8.0f} {median([v[1] for v in values]):>19.0f}")
    cpu = median([g[1] / e[1] for g, e in zip(rows["grpc"], rows["eas"], strict=True)])
    print(f"server CPU per call grpc/eas: {cpu:.2f} (steadier than throughput on a shared machine)")
    ratio = median(ratios)
    verdict = "ok" if ratio >= TARGET else "MISSED"
    print(f"grpc/eas throughput: {ratio:.2f} (target >= {TARGET:.2f}, gRPC within 1.5x of EAS): {verdict}")
    return 0 if ratio >= TARGET else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    round_options(ap, connections=8)
    args = quick_rounds(ap.parse_args())
    if NCPU > 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {1})  # the callers; the gateway and its worker are on core 0
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
