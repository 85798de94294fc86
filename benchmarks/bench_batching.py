"""Dynamic batching in an onnx worker: batching on vs off (see docs/benchmarks.md).

One gateway (pinned to core 0, with its workers) serves six services of one worker
each: ``mlp_on``/``mlp_off`` (mlp_1024x1024x4, built with samples/build_models.py's
``build_mlp``), ``digits_on``/``digits_off`` (the sample digits model) and
``tok_on``/``tok_off`` (the control that cannot gain: a 2-layer 512-wide MLP applied to
128 tokens per row, so every row already is a large matrix product of its own), where
``*_on`` has ``batching: {max_batch_size: 32, max_latency_ms: 0}`` (the default greedy
policy) unless ``--wait-ms`` says otherwise. wrk (core 1) POSTs raw TF PredictRequest
bodies of one row **directly to each worker's HTTP port** (found by service discovery;
``--via gateway`` sends through the gateway instead). Targets are measured in
interleaved rounds (on/off order alternating); ratios are taken within a round and the
median over rounds is reported:

  * mlp: req/s(on) / req/s(off) at c=32        (goal >= 2.5)
  * mlp: p50(on) / p50(off) at c=1             (goal <= 1.1)
  * digits and tok: req/s(on) / req/s(off) at c=32 (goal >= 0.9: batching must not lose > 10%)

Usage: python benchmarks/bench_batching.py [--rounds N] [--seconds S] [--quick]
       [--via direct|gateway] [--wait-ms MS] [--max-batch N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import PY, ROOT, Child, Target, WrkResult, median, pin, report_targets, run_wrk, tree_pids

TOKEN = "bench-token-0123456789"
SERVICES = ("mlp_on", "mlp_off", "digits_on", "digits_off", "tok_on", "tok_off")


def build_body(path: Path, name: str, shape: tuple[int, ...]) -> None:
    from eas_sdk._proto import tf_predict_pb2 as tf

    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    req = tf.PredictRequest(signature_name="predict")
    arr = req.inputs[name]
    arr.dtype = tf.DT_FLOAT
    arr.array_shape.dim.extend(x.shape)
    arr.float_val.extend(x.ravel().tolist())
    path.write_bytes(req.SerializeToString())


def _service(name: str, model: Path, batch: int, wait_ms: float) -> str:
    out = (
        f"  - name: {name}\n    token: {TOKEN}\n    processor: onnx\n    placement: process\n"
        f"    model: {model}\n    workers: 1\n"
    )
    out += "    max_pending: 1024\n"
    if batch:
        out += f"    batching: {{max_batch_size: {batch}, max_latency_ms: {wait_ms}}}\n"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--wait-ms", type=float, default=0.0)
    ap.add_argument("--via", choices=("direct", "gateway"), default="direct")
    ap.add_argument("--quick", action="store_true", help="1 round x 2 s (smoke run, < 40 s)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 2.0

    sys.path.insert(0, str(ROOT / "samples"))
    import build_models  # type: ignore[import-not-found]

    work = Path(tempfile.mkdtemp(prefix="easkit-bench-batching-"))
    digits = Path(build_models.build_all(work / "models")["digits"])
    mlp = build_models.build_mlp(work / "models" / "mlp_1024x1024x4.onnx")
    tok = build_models.build_mlp(work / "models" / "tok_128x512x2.onnx", width=512, layers=2, tokens=128)
    bodies = {"mlp": work / "mlp.bin", "digits": work / "digits.bin", "tok": work / "tok.bin"}
    build_body(bodies["mlp"], "x", (1, 1024))
    build_body(bodies["digits"], build_models.DIGITS_INPUT, (1, 64))
    build_body(bodies["tok"], "x", (1, 128, 512))

    cfg = work / "services.yaml"
    cfg.write_text(
        "gateway:\n  host: 127.0.0.1\n  port: 0\n  access_log: false\n"
        f"  data_dir: {work / 'data'}\n"
        "services:\n"
        + _service("mlp_on", mlp, args.max_batch, args.wait_ms)
        + _service("mlp_off", mlp, 0, 0)
        + _service("digits_on", digits, args.max_batch, args.wait_ms)
        + _service("digits_off", digits, 0, 0)
        + _service("tok_on", tok, args.max_batch, args.wait_ms)
        + _service("tok_off", tok, 0, 0)
    )
    port_file = work / "port"
    env = dict(os.environ, PYTHONUNBUFFERED="1", EASGW_LOG_LEVEL="WARNING")
    argv = [*pin(0), PY, "-m", "gateway", "serve", "--config", str(cfg), "--port", "0"]
    gateway = Child([*argv, "--port-file", str(port_file)], env=env)
    met = True
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists() or not port_file.read_text().strip():
            if gateway.proc.poll() is not None or time.monotonic() > deadline:
                out = gateway.output()
                raise SystemExit(f"gateway did not start:\n{out[-3000:]}")
            time.sleep(0.1)
        gw_addr = port_file.read_text().strip()
        urls: dict[str, str] = {}
        for svc in SERVICES:
            items: list = []
            for _ in range(300):  # workers may still be loading
                with urllib.request.urlopen(f"http://{gw_addr}/api/v1/servicediscovery/upstreams/{svc}") as r:
                    items = json.load(r)["endpoints"]["items"]
                if items:
                    break
                time.sleep(0.1)
            if not items:
                raise SystemExit(f"{svc}: no ready worker")
            host = f"127.0.0.1:{items[0]['port']}" if args.via == "direct" else gw_addr
            urls[svc] = f"http://{host}/api/predict/{svc}"
        pids = tree_pids(gateway.pid)

        def wrk(svc: str, c: int, seconds: float) -> WrkResult:
            model = svc.split("_")[0]
            body = bodies[model]
            r = run_wrk(urls[svc], body, connections=c, seconds=seconds, token=TOKEN, server_pids=pids)
            if r.non2xx or r.errors or not r.requests:
                bad = f"{r.non2xx} non-2xx, {r.errors} socket errors"
                raise SystemExit(f"{svc} c={c}: {bad}: the run is invalid")
            return r

        for svc in urls:  # warm-up
            wrk(svc, args.connections, 1)

        res: dict[str, list[WrkResult]] = {k: [] for k in SERVICES}
        lat1: dict[str, list[WrkResult]] = {"mlp_on": [], "mlp_off": []}
        speedup, lat_ratio, control, control_tok = [], [], [], []
        # CPU-µs per request (server side, off/on): steadier than req/s on a shared machine.
        cpu_gain: dict[str, list[float]] = {m: [] for m in ("mlp", "digits", "tok")}
        for rnd in range(args.rounds):
            order = ("on", "off") if rnd % 2 == 0 else ("off", "on")
            got: dict[str, WrkResult] = {}
            for model in ("mlp", "digits", "tok"):
                for mode in order:
                    svc = f"{model}_{mode}"
                    got[svc] = wrk(svc, args.connections, args.seconds)
                    res[svc].append(got[svc])
            one: dict[str, WrkResult] = {}
            for mode in order:
                svc = f"mlp_{mode}"
                one[svc] = wrk(svc, 1, max(1.0, args.seconds / 2))
                lat1[svc].append(one[svc])
            speedup.append(got["mlp_on"].rps / got["mlp_off"].rps)
            lat_ratio.append(one["mlp_on"].p50_us / one["mlp_off"].p50_us)
            control.append(got["digits_on"].rps / got["digits_off"].rps)
            control_tok.append(got["tok_on"].rps / got["tok_off"].rps)
            for m, gains in cpu_gain.items():
                gains.append(got[f"{m}_off"].cpu_us_per_req / got[f"{m}_on"].cpu_us_per_req)
            print(
                f"round {rnd + 1}/{args.rounds}: mlp on/off {speedup[-1]:.2f}x, c=1 p50 ratio"
                f" {lat_ratio[-1]:.2f}, digits on/off {control[-1]:.2f}x, tok on/off {control_tok[-1]:.2f}x",
                flush=True,
            )

        c = args.connections
        print(f"\nvia {args.via}; max_batch_size {args.max_batch}, max_latency_ms {args.wait_ms}; medians:")
        head = f"{'target':<12}{f'req/s c={c}':>14}{'p50 µs':>10}{'p99 µs':>10}"
        print(f"{head}{'CPU µs/req':>12}{'p50@c=1 µs':>12}")
        for svc, rs in res.items():
            c1 = f"{median([x.p50_us for x in lat1[svc]]):>12.0f}" if svc in lat1 else f"{'-':>12}"
            print(
                f"{svc:<12}{median([x.rps for x in rs]):>14,.0f}{median([x.p50_us for x in rs]):>10.0f}"
                f"{median([x.p99_us for x in rs]):>10.0f}{median([x.cpu_us_per_req for x in rs]):>12.1f}{c1}"
            )
        print("\nratios (median of per-round ratios):")
        print(f"  mlp throughput on/off (c={c}):    {median(speedup):.2f}x   goal >= 2.5")
        print(f"  mlp p50 on/off at c=1:            {median(lat_ratio):.2f}    goal <= 1.1")
        print(f"  digits throughput on/off (c={c}): {median(control):.2f}x   goal >= 0.9")
        print(f"  tok throughput on/off (c={c}):    {median(control_tok):.2f}x   goal >= 0.9 (control)")
        met = report_targets(
            "bench_batching",
            [
                Target(f"batching: mlp throughput on/off (c={c})", median(speedup), ">=", 2.5, "x"),
                Target("batching: mlp p50 on/off at c=1", median(lat_ratio), "<=", 1.1, "x"),
                Target(f"batching: digits throughput on/off (c={c})", median(control), ">=", 0.9, "x"),
                Target(f"batching: tok throughput on/off (c={c})", median(control_tok), ">=", 0.9, "x"),
            ],
        )
        gains = ", ".join(f"{m} {median(g):.2f}x" for m, g in cpu_gain.items())
        print(f"  server CPU per request, off/on:   {gains}")
    finally:
        gateway.stop()
    if not met:
        sys.exit(1)  # after the gateway is stopped; scripts/bench.sh reports it at the end


if __name__ == "__main__":
    main()
