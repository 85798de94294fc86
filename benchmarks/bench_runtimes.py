"""The estimator runtimes (sklearn, xgboost, lightgbm) served by the gateway, against the same
library called in-process and against MLServer 1.7's own runtimes for them, on the same files.

Per runtime, two models trained here on scikit-learn's bundled digits (64 features, 10
classes), each called for its ``predict`` output:

  * ``small``: one row through a model whose run takes tens of microseconds (a logistic
    regression, 2 boosting rounds of XGBoost and of LightGBM), where the gateway's own cost
    shows: the added p50 at c=1;
  * ``large``: 32 rows through a model whose run then takes a millisecond or more (a random
    forest of 30 trees, 200 XGBoost rounds of depth 6, 300 LightGBM rounds: 10 trees a round),
    where throughput at c=32 should be the library's.

Contestants, each pinned to core 0 with wrk on core 1:

  * ``in-process``: the library's own loop (``model.predict(x)`` on the loaded file, one
    thread), in a child process: its p50 and calls per second are the floor;
  * ``gateway``: V2 JSON and the EAS TFRequest, the model on one worker process;
    ``gw-thread``: V2 JSON with the model in the gateway's threads (``placement: thread``);
  * ``mlserver``: MLServer 1.7 with mlserver-sklearn / -xgboost / -lightgbm (``.venv-mlserver``),
    V2 JSON, ``parallel_workers: 0``, as bench_servers.py runs it.

Figures, per runtime (median over rounds of per-round ratios): the gateway's throughput at
c=32 over the in-process loop's (goal >= 0.8 on the large model), the added p50 at c=1 over
the in-process p50 (goal < 100 µs on the small model), and against MLServer on both models:
throughput at c=32 (goal >= 3x) and p99 (goal <= 0.5x) for sklearn and xgboost. On the large
model the library's run is most of every server's work, so that ratio is bounded by it.

Writes ``benchmarks/results/runtimes.json``.
Usage: python benchmarks/bench_runtimes.py [--rounds N] [--seconds S] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import (
    PY,
    ROOT,
    TOKEN,
    Child,
    Target,
    median,
    pin,
    quick_rounds,
    report_targets,
    round_options,
    run_wrk,
    start_gateway,
    tree_pids,
)
from bench_servers import CONCURRENCY, JSON_TYPE, MLSERVER, RESULTS, accepted, start_mlserver, wait_http

RUNTIMES = ("sklearn", "xgboost", "lightgbm")
SIZES = ("small", "large")
DTYPES = {"sklearn": np.float64, "xgboost": np.float32, "lightgbm": np.float64}
MLSERVER_IMPL = {
    "sklearn": "mlserver_sklearn.SKLearnModel",
    "xgboost": "mlserver_xgboost.XGBoostModel",
    "lightgbm": "mlserver_lightgbm.LightGBMModel",
}
FILES = {"sklearn": "model.joblib", "xgboost": "model.json", "lightgbm": "model.txt"}


def build(folder: Path) -> dict[tuple[str, str], Path]:
    """(runtime, size) -> model file, saved as each library saves it (single-threaded models)."""
    import joblib
    import lightgbm as lgb
    import xgboost as xgb
    from sklearn.datasets import load_digits
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    out: dict[tuple[str, str], Path] = {}
    for runtime in RUNTIMES:
        for size in SIZES:
            path = folder / f"{runtime}-{size}" / FILES[runtime]
            path.parent.mkdir(parents=True, exist_ok=True)
            out[(runtime, size)] = path
    joblib.dump(LogisticRegression(max_iter=2000).fit(x, y), out[("sklearn", "small")])
    joblib.dump(RandomForestClassifier(n_estimators=30, random_state=0).fit(x, y), out[("sklearn", "large")])
    for size, trees, depth in (("small", 2, 3), ("large", 200, 6)):
        xgb.XGBClassifier(n_estimators=trees, max_depth=depth, n_jobs=1).fit(x, y).save_model(
            out[("xgboost", size)]
        )
    for size, trees in (("small", 2), ("large", 300)):
        model = lgb.LGBMClassifier(n_estimators=trees, n_jobs=1, verbose=-1).fit(x, y)
        model.booster_.save_model(out[("lightgbm", size)])
    return out


ROWS = {"small": 1, "large": 32}


def rows_of(runtime: str, size: str) -> np.ndarray:
    from sklearn.datasets import load_digits

    return np.ascontiguousarray(load_digits().data[7 : 7 + ROWS[size]], dtype=DTYPES[runtime])


INPROC = r"""
import sys, time, json, numpy as np
runtime, path, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
x = np.load(sys.argv[4])
if runtime == "sklearn":
    import joblib; predict = joblib.load(path).predict
elif runtime == "xgboost":
    import xgboost as xgb; m = xgb.XGBClassifier(n_jobs=1); m.load_model(path)
    predict = lambda a: m.predict(a, validate_features=False)
else:
    import lightgbm as lgb; b = lgb.Booster(model_file=path); predict = lambda a: b.predict(a, num_threads=1)
for _ in range(50):
    predict(x)
times = []
end = time.perf_counter() + seconds
while True:
    t0 = time.perf_counter(); predict(x); t1 = time.perf_counter()
    times.append(t1 - t0)
    if t1 > end:
        break
times.sort()
print(json.dumps({"rps": len(times) / sum(times), "p50_us": times[len(times) // 2] * 1e6,
                  "p99_us": times[int(len(times) * 0.99)] * 1e6}))
"""


def in_process(runtime: str, path: Path, x_file: Path, seconds: float) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [*pin(0), PY, "-c", INPROC, runtime, str(path), str(seconds), str(x_file)],
        capture_output=True, text=True, env=env, check=True, timeout=120,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def start(work: Path, models: dict[tuple[str, str], Path]) -> tuple[dict[str, Any], list[Child]]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", EASGW_LOG_LEVEL="WARNING", OMP_NUM_THREADS="1")
    services = "".join(
        f"  - name: {rt}-{size}{suffix}\n    token: {TOKEN}\n    processor: {rt}\n    model: {path}\n"
        f"    workers: 1\n    placement: {placement}\n"
        for (rt, size), path in models.items()
        for suffix, placement in (("", "process"), ("-thread", "thread"))
    )
    cfg = work / "services.yaml"
    cfg.write_text(
        "gateway:\n  host: 127.0.0.1\n  port: 0\n  access_log: false\n"
        f"  data_dir: {work / 'data'}\n  model_dirs: [{work / 'models'}]\nservices:\n{services}"
    )
    children: list[Child] = []
    gw, addr = start_gateway(cfg, env)
    children.append(gw)
    bases: dict[str, Any] = {"gateway": (f"http://{addr}", gw)}
    for rt, size in models:
        for suffix in ("", "-thread"):
            wait_http(f"http://{addr}/v2/models/{rt}-{size}{suffix}/ready", gw)
    if MLSERVER.exists():
        ml_models = {f"{rt}-{size}": (MLSERVER_IMPL[rt], path) for (rt, size), path in models.items()}
        ml_base, ml = start_mlserver(work / "mlserver", ml_models, env)
        children.append(ml)
        bases["mlserver"] = (ml_base, ml)
    return bases, children


def bodies(work: Path, name: str, x: np.ndarray) -> dict[str, Path]:
    from eas_sdk.codecs.eas import encode_tf_request

    datatype = "FP32" if x.dtype == np.float32 else "FP64"
    doc = {
        "inputs": [
            {"name": "input", "datatype": datatype, "shape": list(x.shape), "data": x.ravel().tolist()}
        ],
        "outputs": [{"name": "predict"}],
    }
    files = {"json": work / f"{name}.json", "tf": work / f"{name}.tf"}
    files["json"].write_bytes(json.dumps(doc, separators=(",", ":")).encode())
    files["tf"].write_bytes(encode_tf_request("predict", {"input": x}, ["predict"]))
    return files


def main() -> None:
    ap = argparse.ArgumentParser()
    round_options(ap, rounds=2, seconds=3.0, connections=None, quick_seconds=1.0)
    args = quick_rounds(ap.parse_args())
    work = Path(tempfile.mkdtemp(prefix="easkit-bench-runtimes-"))
    models = build(work / "models")
    xs = {key: rows_of(*key) for key in models}
    x_files = {}
    for (rt, size), x in xs.items():
        x_files[(rt, size)] = work / f"{rt}-{size}.npy"
        np.save(x_files[(rt, size)], x)
    files = {key: bodies(work, f"{key[0]}-{key[1]}", x) for key, x in xs.items()}
    print("starting the gateway and MLServer ...", flush=True)
    bases, children = start(work, models)
    try:
        gw_base, gw = bases["gateway"]
        plan: list[tuple[str, str, str, str, str, Path, list[int]]] = []
        for rt, size in models:
            name = f"{rt}-{size}"
            v2, tf = files[(rt, size)]["json"], files[(rt, size)]["tf"]
            cands = [
                ("gateway", "V2 JSON", f"{gw_base}/v2/models/{name}/infer", v2, JSON_TYPE, gw),
                ("gateway", "EAS TF", f"{gw_base}/api/predict/{name}", tf, "application/octet-stream", gw),
                ("gw-thread", "V2 JSON", f"{gw_base}/v2/models/{name}-thread/infer", v2, JSON_TYPE, gw),
            ]
            if "mlserver" in bases:
                ml_base, ml = bases["mlserver"]
                cands.append(("mlserver", "V2 JSON", f"{ml_base}/v2/models/{name}/infer", v2,
                              JSON_TYPE, ml))  # fmt: skip
            for server, proto, url, body, ctype, child in cands:
                if not accepted(url, body.read_bytes(), ctype, {}):
                    print(f"  skipped: {server} {proto} on {name} (not accepted)", flush=True)
                    continue
                plan.append((rt, size, server, proto, url, body, tree_pids(child.pid)))
        samples: dict[tuple[str, str, str, str, int], list[dict[str, float]]] = {}
        for rnd in range(args.rounds):
            # Each model's own loop right before its servers, so a ratio compares moments close
            # together on a machine whose load changes.
            done: set[tuple[str, str]] = set()
            for rt, size, server, proto, url, body, pids in plan:
                if (rt, size) not in done:
                    done.add((rt, size))
                    r = in_process(rt, models[(rt, size)], x_files[(rt, size)], args.seconds)
                    for c in CONCURRENCY:
                        samples.setdefault((rt, size, "in-process", "loop", c), []).append(r)
                    print(f"round {rnd + 1} {rt:<9}{size:<6}in-process          {r['rps']:>9,.0f} calls/s  "
                          f"p50 {r['p50_us']:>7.0f} µs  p99 {r['p99_us']:>7.0f} µs", flush=True)  # fmt: skip
                for c in CONCURRENCY:
                    ctype = JSON_TYPE if body.suffix == ".json" else "application/octet-stream"
                    w = run_wrk(url, body, connections=c, seconds=args.seconds, token=TOKEN, server_pids=pids,
                                content_type=ctype)  # fmt: skip
                    failed = (
                        f"{server} {proto} {rt}-{size} c={c}: {w.non2xx} non-2xx, {w.errors} socket errors"
                    )
                    if server != "mlserver" and (w.non2xx or w.errors):
                        raise SystemExit(failed)
                    if w.non2xx or w.errors:  # the reference's timeouts under load: counted, not fatal
                        print(f"  {failed} (wrk's 2 s timeout)", flush=True)
                    samples.setdefault((rt, size, server, proto, c), []).append(
                        {"rps": w.rps, "p50_us": w.p50_us, "p99_us": w.p99_us, "errors": w.non2xx + w.errors}
                    )
                    what = f"round {rnd + 1} {rt:<9}{size:<6}{server:<10}{proto:<9}c={c:<3}"
                    print(
                        f"{what}{w.rps:>9,.0f} req/s  p50 {w.p50_us:>7.0f} µs  p99 {w.p99_us:>7.0f} µs",
                        flush=True,
                    )
        ok = report(samples, args)
    finally:
        for child in children:
            child.stop()
    raise SystemExit(0 if ok else 1)  # a missed target: exit status 1, as scripts/bench.sh reads it


def report(samples: dict[tuple[str, str, str, str, int], list[dict[str, float]]], args: Any) -> bool:
    rows = [
        {"runtime": rt, "model": size, "server": srv, "protocol": proto, "connections": c,
         **{k: median([s[k] for s in ss]) for k in ("rps", "p50_us", "p99_us")},
         "errors": sum(s.get("errors", 0) for s in ss)}
        for (rt, size, srv, proto, c), ss in samples.items()
    ]  # fmt: skip
    print(f"\n{'runtime':<10}{'model':<7}{'server':<11}{'protocol':<10}{'conn':>5}{'req/s':>10}{'p50 µs':>9}"
          f"{'p99 µs':>9}")  # fmt: skip
    for r in rows:
        print(f"{r['runtime']:<10}{r['model']:<7}{r['server']:<11}{r['protocol']:<10}{r['connections']:>5}"
              f"{r['rps']:>10,.0f}{r['p50_us']:>9.0f}{r['p99_us']:>9.0f}"
              + (f"  {r['errors']:.0f} failed calls" if r.get("errors") else ""))  # fmt: skip

    def ratio(a: tuple[Any, ...], b: tuple[Any, ...], key: str, op: str = "/") -> float | None:
        xs, ys = samples.get(a), samples.get(b)
        if not xs or not ys:
            return None
        if op == "-":
            return median([x[key] - y[key] for x, y in zip(xs, ys, strict=True)])
        return median([x[key] / y[key] for x, y in zip(xs, ys, strict=True)])

    targets: list[Target] = []
    for rt in RUNTIMES:
        for server in ("gateway", "gw-thread"):
            who = "" if server == "gateway" else "thread "
            tp = ratio((rt, "large", server, "V2 JSON", 32), (rt, "large", "in-process", "loop", 32), "rps")
            if tp is not None:
                targets.append(Target(f"{rt} {who}large c=32 vs in-process", tp, ">=", 0.8, "x"))
            added = ratio(
                (rt, "small", server, "V2 JSON", 1), (rt, "small", "in-process", "loop", 1), "p50_us", "-"
            )
            if added is not None:
                targets.append(Target(f"{rt} {who}small added p50 c=1", added, "<", 100.0, "µs"))
            if rt == "lightgbm":
                continue
            for size in SIZES:
                for c in CONCURRENCY:
                    ours, theirs = (rt, size, server, "V2 JSON", c), (rt, size, "mlserver", "V2 JSON", c)
                    if c > 1 and (tp_ml := ratio(ours, theirs, "rps")) is not None:
                        targets.append(Target(f"{rt} {who}{size} c={c} vs MLServer", tp_ml, ">=", 3.0, "x"))
                    if (p99 := ratio(ours, theirs, "p99_us")) is not None:
                        targets.append(Target(f"{rt} {who}{size} p99 c={c} vs MLServer", p99, "<=", 0.5, "x"))
    for t in targets:  # the harness knows >= and <=; "<" here is a bound on a difference
        if t.op == "<":
            t.op = "<="
    ok = report_targets("bench_runtimes", targets)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "runtimes.json"
    out.write_text(json.dumps({"rounds": args.rounds, "seconds": args.seconds, "rows": rows,
                               "targets": [t.__dict__ for t in targets]}, indent=1))  # fmt: skip
    print(f"\nwrote {out.relative_to(ROOT)}")
    return ok


if __name__ == "__main__":
    main()
