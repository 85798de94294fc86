"""KServe V2 REST vs the EAS TFRequest path on one large input, side by side in one run.

One gateway, one small real ONNX model (global average pool of a 1x3x224x224 FP32 image,
then a 3x10 dense layer and softmax), one worker. Three ways to send the same 602 KB
tensor, measured in interleaved rounds with wrk (core 1) against the gateway and its
worker (core 0):
  * eas       POST /api/predict/<svc>, a TF PredictRequest (the EAS SDK's TFRequest body)
  * v2-binary POST /v2/models/<svc>/infer with the binary tensor data extension, the
              answer binary too (binary_data_output), as tritonclient sends it by default
  * v2-json   the same call with the tensor as JSON data (informational)

Prints req/s, p50/p99 and server CPU-µs per request for each, then the ratios:
  * v2-binary / eas throughput   (target: binary V2 within 1.5x of the EAS path, >= 0.67)
  * v2-json / eas throughput     (reported)
  * eas / v2-binary server CPU per call (reported; steadier than throughput on a busy machine)

Usage: python benchmarks/bench_kserve.py [--rounds N] [--seconds S] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import median, quick_rounds, round_options, run_wrk, start_gateway, tree_pids

TOKEN = "bench-token-0123456789"
SHAPE = (1, 3, 224, 224)


def build_model(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "pool_dense",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])],
        initializer=[numpy_helper.from_array(rng.standard_normal((3, 10)).astype(np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def build_bodies(work: Path, x: np.ndarray) -> dict[str, tuple[Path, dict[str, str]]]:
    from eas_sdk import TFRequest

    eas = TFRequest("predict")
    eas.add_feed("image", list(x.shape), TFRequest.DT_FLOAT, x)
    header = json.dumps(
        {
            "inputs": [
                {"name": "image", "shape": list(x.shape), "datatype": "FP32",
                 "parameters": {"binary_data_size": x.nbytes}},
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()  # fmt: skip
    plain = {
        "inputs": [{"name": "image", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]
    }
    bodies = {
        "eas": (eas.to_string(), {}),
        "v2-binary": (header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}),
        "v2-json": (json.dumps(plain).encode(), {"Content-Type": "application/json"}),
    }
    out = {}
    for name, (data, headers) in bodies.items():
        path = work / f"{name}.body"
        path.write_bytes(data)
        out[name] = (path, headers)
    return out


def check(url: str, body: Path, headers: dict[str, str]) -> None:
    """One call per target before timing: each must answer 200."""
    req = urllib.request.Request(url, data=body.read_bytes(), headers={"Authorization": TOKEN, **headers})
    with urllib.request.urlopen(req, timeout=30) as r:
        if r.status != 200:
            raise SystemExit(f"{url}: status {r.status}")


def main() -> None:
    ap = argparse.ArgumentParser()
    round_options(ap, connections=4)
    args = quick_rounds(ap.parse_args())

    work = Path(tempfile.mkdtemp(prefix="easkit-bench-kserve-"))
    model = work / "pool_dense.onnx"
    build_model(model)
    x = np.random.default_rng(1).random(SHAPE, dtype=np.float32)
    bodies = build_bodies(work, x)
    cfg = work / "services.yaml"
    cfg.write_text(
        f"gateway:\n  host: 127.0.0.1\n  port: 0\n  access_log: false\n  data_dir: {work / 'data'}\n"
        f"services:\n  - name: pool\n    token: {TOKEN}\n    processor: onnx\n    placement: process\n"
        f"    model: {model}\n    workers: 1\n"
    )
    env = dict(os.environ, PYTHONUNBUFFERED="1", EASGW_LOG_LEVEL="WARNING")
    gateway, addr = start_gateway(cfg, env)
    try:
        pids = tree_pids(gateway.pid)
        urls = {
            "eas": f"http://{addr}/api/predict/pool",
            "v2-binary": f"http://{addr}/v2/models/pool/infer",
            "v2-json": f"http://{addr}/v2/models/pool/infer",
        }
        for name, url in urls.items():
            check(url, *bodies[name])
            run_wrk(url, bodies[name][0], connections=args.connections, seconds=1, token=TOKEN,
                    server_pids=pids, headers=bodies[name][1])  # fmt: skip

        rows: dict[str, list] = {k: [] for k in urls}
        ratios: dict[str, list[float]] = {"v2-binary": [], "v2-json": []}
        cpu_ratios: list[float] = []  # EAS CPU per call / binary V2's: steadier than req/s on a busy machine
        for rnd in range(args.rounds):
            res = {}
            for name, url in urls.items():
                path, headers = bodies[name]
                r = run_wrk(url, path, connections=args.connections, seconds=args.seconds, token=TOKEN,
                            server_pids=pids, headers=headers)  # fmt: skip
                if r.non2xx or r.errors:
                    raise SystemExit(
                        f"{name}: {r.non2xx} non-2xx, {r.errors} socket errors: the run is invalid"
                    )
                res[name] = r
                rows[name].append(r)
            for name in ratios:
                ratios[name].append(res[name].rps / res["eas"].rps)
            cpu_ratios.append(res["eas"].cpu_us_per_req / res["v2-binary"].cpu_us_per_req)
            figures = ", ".join(f"{n} {r.rps:,.0f} rps" for n, r in res.items())
            print(f"round {rnd + 1}/{args.rounds}: {figures}", flush=True)

        print(f"\n1x3x224x224 FP32 ({x.nbytes:,} bytes), c={args.connections}")
        print(f"{'target':<11}{'req/s':>9}{'p50 µs':>10}{'p99 µs':>10}{'CPU µs/req':>12}")
        for name, rs in rows.items():
            print(
                f"{name:<11}{median([r.rps for r in rs]):>9,.1f}{median([r.p50_us for r in rs]):>10.0f}"
                f"{median([r.p99_us for r in rs]):>10.0f}{median([r.cpu_us_per_req for r in rs]):>12.0f}"
            )
        binary, plain = median(ratios["v2-binary"]), median(ratios["v2-json"])
        print("\nratios (median of per-round ratios):")
        verdict = "pass" if binary >= 1 / 1.5 else "MISS"
        print(f"  {'v2-binary / eas throughput:':<32}{binary:>8.2f}   target >= 0.67   {verdict}")
        print(f"  {'v2-json / eas throughput:':<32}{plain:>8.2f}   (reported)")
        cpu = median(cpu_ratios)
        print(f"  {'eas / v2-binary server CPU:':<32}{cpu:>8.2f}   (reported: 1.0 = the same cost per call)")
    finally:
        gateway.stop()


if __name__ == "__main__":
    main()
