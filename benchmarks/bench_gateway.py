"""Gateway overhead: wrk -> gateway -> worker vs wrk -> worker vs a bare aiohttp server.

Three targets, measured in interleaved rounds with wrk (core 1) against servers
pinned to core 0 (the gateway and its worker share core 0, so the gateway is
charged its full CPU). The body is a TF PredictRequest for one digits row, and
the token is checked on every call through the gateway and the worker.

Two more targets run in the same rounds for reference, with no goal: the floor of a
call through the gateway (benchmarks/gateway_floor_server.py: our HTTP front and the
gateway's worker RPC to the same worker, with no checks, metrics or log), and that
floor with the gateway's access line. They show how much of the gateway's cost the
hop to a worker process takes by itself.

Prints per-target req/s, p50/p99 and server CPU-µs per request, then the ratios
the project tracks:
  * gateway / direct throughput at c=16            (target >= 0.90)
  * p50(gateway) - p50(direct) at c=1              (target <= 50 µs)
  * worker CPU per request / bare aiohttp's        (target <= 2.0)

Usage: python benchmarks/bench_gateway.py [--rounds N] [--seconds S] [--quick]
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

from _harness import (
    PY,
    ROOT,
    TOKEN,
    Child,
    Target,
    checked,
    free_port,
    median,
    pin,
    quick_rounds,
    report_targets,
    round_options,
    run_wrk,
    start_gateway,
    tf_predict_body,
    tree_pids,
    wait_port,
)
from gateway_floor_server import worker_socket


def build_body(path: Path, input_name: str) -> None:
    x = np.linspace(0, 16, 64, dtype=np.float32).reshape(1, 64)
    tf_predict_body(path, x, input_name=input_name, signature_name="predict")


def main() -> None:
    ap = argparse.ArgumentParser()
    round_options(ap, connections=16)
    ap.add_argument(
        "--access-log",
        action="store_true",
        help="the gateway as configured by default: access log on at INFO (off by default here)",
    )
    args = quick_rounds(ap.parse_args())

    sys.path.insert(0, str(ROOT / "samples"))
    import build_models  # type: ignore[import-not-found]

    work = Path(tempfile.mkdtemp(prefix="easkit-bench-"))
    models = build_models.build_all(work / "models")
    model = Path(models["digits"]) if isinstance(models, dict) else work / "models" / "digits.onnx"
    input_name = getattr(build_models, "DIGITS_INPUT", "input")
    body = work / "body.bin"
    build_body(body, input_name)

    cfg = work / "services.yaml"
    cfg.write_text(
        "gateway:\n  host: 127.0.0.1\n  port: 0\n"
        f"  access_log: {'true' if args.access_log else 'false'}\n"
        f"  data_dir: {work / 'data'}\n"
        "services:\n"
        f"  - name: digits\n    token: {TOKEN}\n    processor: onnx\n    placement: process\n"
        f"    model: {model}\n    workers: 1\n"
    )
    env = dict(os.environ, PYTHONUNBUFFERED="1", EASGW_LOG_LEVEL="INFO" if args.access_log else "WARNING")
    hello_port = free_port()
    gateway, gw_addr = start_gateway(cfg, env)
    hello = Child([*pin(0), PY, str(ROOT / "benchmarks" / "hello_server.py"), str(hello_port)], env=env)
    floors: list[Child] = []
    try:
        wait_port(hello_port)
        with urllib.request.urlopen(f"http://{gw_addr}/api/v1/servicediscovery/upstreams/digits") as r:
            items = json.load(r)["endpoints"]["items"]
        worker_port = int(items[0]["port"])
        worker_pids = [p for p in tree_pids(gateway.pid) if p != gateway.pid]
        gw_pids = tree_pids(gateway.pid)
        floor_ports = {"floor": free_port(), "floor+log": free_port()}
        rpc_socket = worker_socket(worker_pids[0])
        for name, port in floor_ports.items():
            argv = [*pin(0), PY, str(ROOT / "benchmarks" / "gateway_floor_server.py"), str(port), rpc_socket]
            argv += ["--access-log"] if name == "floor+log" else []
            floors.append(Child(argv, env=env))
        for port in floor_ports.values():
            wait_port(port)
        targets = {
            "gateway": (f"http://{gw_addr}/api/predict/digits", gw_pids),
            "direct": (f"http://127.0.0.1:{worker_port}/api/predict/digits", worker_pids),
            "hello": (f"http://127.0.0.1:{hello_port}/api/predict/digits", tree_pids(hello.pid)),
            **{
                name: (f"http://127.0.0.1:{port}/api/predict/digits", [floor.pid, *worker_pids])
                for (name, port), floor in zip(floor_ports.items(), floors, strict=True)
            },
        }
        # Latency at one request in flight: every path to the worker.
        paths = ("gateway", "direct", "floor", "floor+log")
        # Warm-up: one throw-away second per target.
        for url, pids in targets.values():
            run_wrk(url, body, connections=args.connections, seconds=1, token=TOKEN, server_pids=pids)

        rows: dict[str, list] = {k: [] for k in targets}
        lat1: dict[str, list] = {k: [] for k in paths}
        ratios, dp50, cpu_ratio = [], [], []
        floor_ratios: dict[str, list[float]] = {k: [] for k in floor_ports}
        floor_dp50: dict[str, list[float]] = {k: [] for k in floor_ports}
        for rnd in range(args.rounds):
            res = {}
            for name, (url, pids) in targets.items():
                r = run_wrk(
                    url,
                    body,
                    connections=args.connections,
                    seconds=args.seconds,
                    token=TOKEN,
                    server_pids=pids,
                )
                res[name] = checked(name, r)
                rows[name].append(r)
            one = {}
            for name in paths:
                url, pids = targets[name]
                one[name] = run_wrk(
                    url, body, connections=1, seconds=args.seconds / 2, token=TOKEN, server_pids=pids
                )
                lat1[name].append(one[name])
            ratios.append(res["gateway"].rps / res["direct"].rps)
            dp50.append(one["gateway"].p50_us - one["direct"].p50_us)
            cpu_ratio.append(res["direct"].cpu_us_per_req / res["hello"].cpu_us_per_req)
            for name in floor_ports:
                floor_ratios[name].append(res[name].rps / res["direct"].rps)
                floor_dp50[name].append(one[name].p50_us - one["direct"].p50_us)
            print(
                f"round {rnd + 1}/{args.rounds}: "
                + ", ".join(f"{name} {r.rps:,.0f} rps" for name, r in res.items()),
                flush=True,
            )

        print(
            f"\n{'target':<10}{'req/s':>10}{'p50 µs':>10}{'p99 µs':>10}{'CPU µs/req':>12}{'p50@c=1 µs':>12}"
        )
        for name, rs in rows.items():
            c1 = f"{median([x.p50_us for x in lat1[name]]):>12.0f}" if name in lat1 else f"{'-':>12}"
            print(
                f"{name:<10}{median([x.rps for x in rs]):>10,.0f}{median([x.p50_us for x in rs]):>10.0f}"
                f"{median([x.p99_us for x in rs]):>10.0f}{median([x.cpu_us_per_req for x in rs]):>12.1f}{c1}"
            )
        r_tp, r_dp, r_cpu = median(ratios), median(dp50), median(cpu_ratio)
        print("\nratios (median of per-round ratios):")
        rows_out = [
            (f"gateway/direct throughput (c={args.connections}):", f"{r_tp:.2f}", ">= 0.90", r_tp >= 0.90),
            ("p50 added by the gateway at c=1:", f"{r_dp:+.0f} µs", "<= 50 µs", r_dp <= 50),
            ("worker CPU per request / bare aiohttp:", f"{r_cpu:.2f}", "<= 2.0", r_cpu <= 2.0),
        ]
        for label, figure, goal, ok in rows_out:
            print(f"  {label:<40}{figure:>10}   target {goal:<10}{'pass' if ok else 'MISS'}")
        f_tp = {k: median(v) for k, v in floor_ratios.items()}
        f_dp = {k: median(v) for k, v in floor_dp50.items()}
        print("for reference, the floor of a call through the gateway (no goal):")
        for name in floor_ports:
            print(f"  {name + '/direct throughput:':<40}{f_tp[name]:>10.2f}")
            print(f"  {'p50 added by ' + name + ' at c=1:':<40}{f_dp[name]:>+7.0f} µs")
        missed = not report_targets(
            "bench_gateway",
            [
                Target(f"gateway: throughput / direct (c={args.connections})", r_tp, ">=", 0.90, "x"),
                Target("gateway: p50 added at c=1", r_dp, "<=", 50, "us"),
                Target("gateway: worker CPU per request / aiohttp", r_cpu, "<=", 2.0, "x"),
                *(Target(f"gateway: {k} throughput / direct", f_tp[k], "", None, "x") for k in floor_ports),
                *(Target(f"gateway: {k} p50 added at c=1", f_dp[k], "", None, "us") for k in floor_ports),
            ],
        )
    finally:
        gateway.stop()
        hello.stop()
        for floor in floors:
            floor.stop()
    if missed:
        sys.exit(1)  # after the servers are stopped; scripts/bench.sh reports it at the end


if __name__ == "__main__":
    main()
