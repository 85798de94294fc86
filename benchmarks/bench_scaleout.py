"""Scale-out: two gateways on one Redis against one gateway, on the predict path.

Both gateways load the same services file: the digits model (one worker each) and a queue
service whose store is one shared redis-server (so they are two gateways of one
deployment, one of them holding the queues' owner lease). Each gateway and its worker are
pinned to a core of their own, and each is driven by its own wrk on another core:

  * one:  gateway A (core 0) <- wrk (core 2)
  * two:  gateway A (core 0) <- wrk (core 2)  and  gateway B (core 1) <- wrk (core 3)

Rounds alternate one and two; the ratio (two gateways' summed throughput / one's) is taken
within each round and the median over rounds is reported. Goal: >= 1.7x.

The layout needs four cores. On a smaller machine each wrk runs on the cores of the
gateways, so in the two-gateway case the load generators take CPU from both gateways while
in the one-gateway case wrk has the idle core to itself: the ratio there is a lower bound of
the layout's. It is held to the goal when it meets it (the layout's can only be higher) and
reported without a verdict when it does not.

Usage: python benchmarks/bench_scaleout.py [--rounds N] [--seconds S] [--connections C] [--quick]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import (
    NCPU,
    ROOT,
    TOKEN,
    Target,
    WrkResult,
    median,
    quick_rounds,
    report_targets,
    round_options,
    run_wrk,
    start_gateway,
    tree_pids,
)
from bench_gateway import build_body
from bench_queue import Redis

CORES_NEEDED = 4
GOAL = 1.7


def write_config(path: Path, data_dir: Path, model: Path, redis_url: str) -> None:
    path.write_text(
        "gateway:\n  host: 127.0.0.1\n  port: 0\n  access_log: false\n"
        f"  data_dir: {data_dir}\n"
        f"queue:\n  backend: {redis_url}\n"
        "services:\n"
        f"  - name: digits\n    token: {TOKEN}\n    processor: onnx\n    placement: process\n"
        f"    model: {model}\n    workers: 1\n"
        f"  - name: jobs\n    token: {TOKEN}\n    processor: queue\n"
    )


def drive(urls_cores: list[tuple[str, int]], body: Path, connections: int, seconds: float) -> list[WrkResult]:
    """One wrk per (url, core), all at once."""
    with concurrent.futures.ThreadPoolExecutor(len(urls_cores)) as pool:
        futures = [
            pool.submit(run_wrk, url, body, connections=connections, seconds=seconds, token=TOKEN, core=core)
            for url, core in urls_cores
        ]
        return [f.result() for f in futures]


def main() -> None:
    ap = argparse.ArgumentParser()
    round_options(ap, connections=16)
    args = quick_rounds(ap.parse_args())
    enough = NCPU >= CORES_NEEDED
    if not enough:
        print(
            f"{NCPU} cores here, the layout needs {CORES_NEEDED}: wrk shares the gateways' cores, "
            "so the ratio is a lower bound (held to the goal only when it meets it)"
        )

    sys.path.insert(0, str(ROOT / "samples"))
    import build_models  # type: ignore[import-not-found]

    work = Path(tempfile.mkdtemp(prefix="easkit-bench-scaleout-"))
    models = build_models.build_all(work / "models")
    model = Path(models["digits"]) if isinstance(models, dict) else work / "models" / "digits.onnx"
    body = work / "body.bin"
    build_body(body, getattr(build_models, "DIGITS_INPUT", "input"))

    redis_srv = Redis()
    redis_url = f"redis://127.0.0.1:{redis_srv.port}/0"
    env = dict(os.environ, PYTHONUNBUFFERED="1", EASGW_LOG_LEVEL="WARNING")
    gateways = []
    try:
        addrs = []
        for i, core in enumerate((0, 1)):
            (work / f"gw{i}").mkdir()
            cfg = work / f"gw{i}" / "services.yaml"
            write_config(cfg, work / f"gw{i}" / "data", model, redis_url)
            gw, addr = start_gateway(cfg, env, core=core)
            gateways.append(gw)
            addrs.append(addr)
        for gw in gateways:
            print(f"gateway pid {gw.pid}: {len(tree_pids(gw.pid)) - 1} worker(s)")
        urls = [f"http://{a}/api/predict/digits" for a in addrs]
        drive([(urls[0], 2)], body, args.connections, 1.0)  # warm up both paths
        drive([(urls[1], 3)], body, args.connections, 1.0)
        ratios, ones, twos = [], [], []
        for r in range(args.rounds):
            (one,) = drive([(urls[0], 2)], body, args.connections, args.seconds)
            two = drive([(urls[0], 2), (urls[1], 3)], body, args.connections, args.seconds)
            failed = one.non2xx + one.errors + sum(t.non2xx + t.errors for t in two)
            if failed:
                raise SystemExit(f"round {r + 1}: {failed} failed calls")
            total = sum(t.rps for t in two)
            ones.append(one.rps)
            twos.append(total)
            ratios.append(total / one.rps)
            print(
                f"round {r + 1}: one gateway {one.rps:,.0f} req/s; two gateways {total:,.0f} req/s "
                f"({' + '.join(f'{t.rps:,.0f}' for t in two)}); ratio {ratios[-1]:.2f}"
            )
        print(f"\nmedian: one {median(ones):,.0f} req/s, two {median(twos):,.0f} req/s")
        scenario = "two gateways on one Redis / one gateway (predict)"
        ratio = median(ratios)
        bounded = enough or ratio >= GOAL  # a lower bound over the goal meets it
        target = Target(scenario, ratio, ">=", GOAL, "x") if bounded else Target(scenario, ratio, "")
        ok = report_targets("bench_scaleout", [target])
    finally:
        for gw in gateways:
            gw.stop()
        redis_srv.proc.terminate()
        redis_srv.proc.wait(10)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
