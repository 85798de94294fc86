"""The estimator runtimes (sklearn, xgboost, lightgbm) served by the gateway, against the same
library called in-process and against MLServer 1.7's own runtimes for them, on the same files.

Per runtime, two models trained here on scikit-learn's bundled digits (64 features, 10
classes), each called for its ``predict`` output:

  * ``small``: one row through a model whose run takes tens of microseconds (a logistic
    regression, 2 boosting rounds of XGBoost and of LightGBM), where the gateway's own cost
    shows: the added p50 at c=1;
  * ``large``: 64 rows through a model whose run then takes a millisecond or more (a random
    forest of 30 trees, 1000 XGBoost rounds of depth 6, 300 LightGBM rounds: 10 trees a
    round), where throughput at c=32 should be the library's.

Contestants, each pinned to core 0 with wrk on core 1 (the gateway with ``busy_poll_us: 300``,
its setting for callers one at a time; ``--busy-poll-us 0`` turns it off):

  * ``in-process``: the library's own loop (``model.predict(x)`` on the loaded file, one
    thread; for XGBoost the classifier's labels as the gateway computes them, from its
    Booster without the scikit-learn interface's per-call configuration switch, so that the
    added p50 is the gateway's own cost), in a child process: its p50 and calls per second
    are the floor;
  * ``gateway``: V2 JSON and the EAS TFRequest, the model on one worker process;
    ``gw-thread``: V2 JSON with the model in the gateway's threads (``placement: thread``);
    ``gw-batch``: the same with dynamic batching (greedy: ``max_latency_ms: 0``), the
    setting for throughput: the calls that queue while a run works share the next run;
  * ``mlserver``: MLServer 1.7 with mlserver-sklearn / -xgboost / -lightgbm (``.venv-mlserver``),
    V2 JSON, ``parallel_workers: 0``, as bench_servers.py runs it.

Figures, per runtime (median over rounds of per-round ratios): the gateway's throughput at
c=32 over the in-process loop's (goal >= 0.8 on the large model), the added p50 at c=1 over
the in-process p50 (goal < 100 µs on the small model), and against MLServer on both models:
throughput at c=32 (goal >= 3x) and p99 (goal <= 0.5x) for sklearn and xgboost. On the large
model the library's run is most of every server's work, so that ratio is bounded by what
batching saves of it: much for a random forest, whose run has a large fixed cost, little for
a boosted ensemble, whose run grows with its rows (the ceiling row below measures it).

Last, two bounds measured on the machine. The floor of any call at c=1 (``floor``): the
gateway's lean HTTP front alone, answering at once with nothing behind it
(``front_floor_server.py``), its loop sleeping between calls and polling as the gateway's
does: what is left of a served call's latency once the gateway's own work and the model are
taken away. And the ceiling of batching on the large models (``in-process``, ``32 calls``):
the library's own loop on the rows of 32 calls at once, in calls per second: the most any
server that batches the 32 calls in flight can serve on the one core, reported against
MLServer's throughput at c=32 beside the 3x goal.

Writes ``benchmarks/results/runtimes.json``.
Usage: python benchmarks/bench_runtimes.py [--rounds N] [--seconds S] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import (
    PY,
    ROOT,
    Child,
    Target,
    free_port,
    pin,
    quick_rounds,
    round_options,
    run_wrk,
    tree_pids,
    wait_port,
)
from _runtimes_common import (
    BUSY_POLL_US,
    LOOP,
    Bench,
    Call,
    Model,
    Samples,
    gateway_env,
    in_process,
    ratio,
    start_services,
    v2_body,
)
from bench_servers import CONCURRENCY, JSON_TYPE, MLSERVER, start_mlserver

RUNTIMES = ("sklearn", "xgboost", "lightgbm")
# The runtimes whose throughput and p99 are held against MLServer's (LightGBM's only against
# the library's own loop).
VS_MLSERVER = ("sklearn", "xgboost")
SIZES = ("small", "large")
DTYPES = {"sklearn": np.float64, "xgboost": np.float32, "lightgbm": np.float64}
MLSERVER_IMPL = {
    "sklearn": "mlserver_sklearn.SKLearnModel",
    "xgboost": "mlserver_xgboost.XGBoostModel",
    "lightgbm": "mlserver_lightgbm.LightGBMModel",
}
FILES = {"sklearn": "model.joblib", "xgboost": "model.json", "lightgbm": "model.txt"}


def build(folder: Path, sizes: tuple[str, ...] = SIZES) -> dict[tuple[str, str], Path]:
    """(runtime, size) -> model file for each of ``sizes``, saved as each library saves it
    (single-threaded models)."""
    import joblib
    import lightgbm as lgb
    import xgboost as xgb
    from sklearn.datasets import load_digits
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    out: dict[tuple[str, str], Path] = {}
    for runtime in RUNTIMES:
        for size in sizes:
            path = folder / f"{runtime}-{size}" / FILES[runtime]
            path.parent.mkdir(parents=True, exist_ok=True)
            out[(runtime, size)] = path
    sklearn_models = {
        "small": lambda: LogisticRegression(max_iter=2000),
        "large": lambda: RandomForestClassifier(n_estimators=30, random_state=0),
    }
    xgb_trees = {"small": (2, 3), "large": (1000, 6)}  # rounds, depth
    lgb_trees = {"small": 2, "large": 300}
    for size in sizes:
        joblib.dump(sklearn_models[size]().fit(x, y), out[("sklearn", size)])
        trees, depth = xgb_trees[size]
        xgb.XGBClassifier(n_estimators=trees, max_depth=depth, n_jobs=1).fit(x, y).save_model(
            out[("xgboost", size)]
        )
        model = lgb.LGBMClassifier(n_estimators=lgb_trees[size], n_jobs=1, verbose=-1).fit(x, y)
        model.booster_.save_model(out[("lightgbm", size)])
    return out


ROWS = {"small": 1, "large": 64}


def rows_of(runtime: str, size: str) -> np.ndarray:
    from sklearn.datasets import load_digits

    return np.ascontiguousarray(load_digits().data[7 : 7 + ROWS[size]], dtype=DTYPES[runtime])


LOADER = r"""
if runtime == "sklearn":
    import joblib; predict = joblib.load(path).predict
elif runtime == "xgboost":
    import xgboost as xgb; m = xgb.XGBClassifier(n_jobs=1); m.load_model(path); b = m.get_booster()
    predict = lambda a: np.argmax(b.inplace_predict(a, validate_features=False), axis=1)
else:
    import lightgbm as lgb; b = lgb.Booster(model_file=path); predict = lambda a: b.predict(a, num_threads=1)
"""
# Only our gateway must answer every call: MLServer's failures under load are counted. A call a
# server refuses is left out of the plan (said so).
BENCH = Bench("bench_runtimes", "runtimes.json", RUNTIMES, LOADER, cpu_column=False, socket_errors_ok=False,
              skip_refused=True)  # fmt: skip


def bodies(work: Path, name: str, x: np.ndarray) -> dict[str, Path]:
    from eas_sdk.codecs.eas import encode_tf_request

    tf = work / f"{name}.tf"
    tf.write_bytes(encode_tf_request("predict", {"input": x}, ["predict"]))
    return {"json": v2_body(work / f"{name}.json", "input", "predict", x), "tf": tf}


def main() -> None:
    ap = argparse.ArgumentParser()
    round_options(ap, rounds=2, seconds=3.0, connections=None, quick_seconds=1.0)
    ap.add_argument("--busy-poll-us", type=int, default=BUSY_POLL_US, help="gateway.busy_poll_us (0: off)")
    args = quick_rounds(ap.parse_args())
    work = Path(tempfile.mkdtemp(prefix="easkit-bench-runtimes-"))
    models = build(work / "models")
    xs = {key: rows_of(*key) for key in models}
    files = {key: bodies(work, f"{key[0]}-{key[1]}", x) for key, x in xs.items()}
    print("starting the gateway and MLServer ...", flush=True)
    gw_base, gw = start_services(work, models, batched=True, busy_poll_us=args.busy_poll_us)
    children = [gw]
    ml_base, ml_pids = "", []
    try:
        if MLSERVER.exists():
            ml_models = {f"{rt}-{size}": (MLSERVER_IMPL[rt], path) for (rt, size), path in models.items()}
            ml_base, ml = start_mlserver(work / "mlserver", ml_models, gateway_env())
            children.append(ml)
            ml_pids = tree_pids(ml.pid)
        calls: list[Call] = []
        gw_pids = tree_pids(gw.pid)
        for rt, size in models:
            name = f"{rt}-{size}"
            v2, tf = files[(rt, size)]["json"], files[(rt, size)]["tf"]
            ours = [
                ("gateway", "V2 JSON", f"/v2/models/{name}/infer", v2, JSON_TYPE),
                ("gateway", "EAS TF", f"/api/predict/{name}", tf, "application/octet-stream"),
                ("gw-thread", "V2 JSON", f"/v2/models/{name}-thread/infer", v2, JSON_TYPE),
                ("gw-batch", "V2 JSON", f"/v2/models/{name}-batch/infer", v2, JSON_TYPE),
            ]
            calls += [Call(rt, size, srv, proto, gw_base + path, body, ctype, gw_pids)
                      for srv, proto, path, body, ctype in ours]  # fmt: skip
            if ml_base:
                calls.append(Call(rt, size, "mlserver", "V2 JSON", f"{ml_base}/v2/models/{name}/infer", v2,
                                  JSON_TYPE, ml_pids, reference=True))  # fmt: skip
        samples = BENCH.measure(calls, models, xs, work, args)
        floors(samples, files[("lightgbm", "small")]["json"], args)
        ceilings(samples, models, xs, work, args)
        ok = report(samples, args)
    finally:
        for child in children:
            child.stop()
    raise SystemExit(0 if ok else 1)  # a missed target: exit status 1, as scripts/bench.sh reads it


def floors(samples: Samples, body: Path, args: argparse.Namespace) -> None:
    """The floor of any call at c=1: the lean front answering at once with nothing behind it
    (front_floor_server.py, pinned as the gateway is), its loop sleeping between calls and
    polling as the gateway's does, ``args.rounds`` runs of each, in the table as ``floor``."""
    env = dict(gateway_env(), PYTHONPATH=str(ROOT))
    for label, window in (("sleeping", 0), ("polling", args.busy_poll_us)):
        if label == "polling" and not window:
            continue
        port = free_port()
        argv = [*pin(0), PY, str(ROOT / "benchmarks" / "front_floor_server.py"), str(port), "--busy-poll-us",
                str(window)]  # fmt: skip
        with Child(argv, env=env) as child:
            wait_port(port)
            for rnd in range(1, args.rounds + 1):
                url = f"http://127.0.0.1:{port}/api/predict/floor"
                w = run_wrk(url, body, connections=1, seconds=args.seconds, server_pids=[child.pid],
                            content_type=JSON_TYPE)  # fmt: skip
                sample = {"rps": w.rps, "p50_us": w.p50_us, "p99_us": w.p99_us, "cpu_us": w.cpu_us_per_req,
                          "errors": w.non2xx + w.errors}  # fmt: skip
                samples.setdefault(("floor", "-", "front", label, 1), []).append(sample)
                print(
                    f"round {rnd} floor: the lean front alone, {label:<8} p50 {w.p50_us:>5.0f} µs", flush=True
                )


# The batching ceiling's key: the library's loop on the rows of BATCHED_CALLS calls per run.
BATCHED_CALLS = max(CONCURRENCY)
CEILING = ("in-process", f"{BATCHED_CALLS} calls")


def ceilings(samples: Samples, models: dict[Model, Path], xs: dict[Model, np.ndarray], work: Path,
             args: argparse.Namespace) -> None:  # fmt: skip
    """The most batching can serve of each large model held against MLServer, on one core:
    the library's own loop (pinned as the gateway is) over the rows of ``BATCHED_CALLS``
    calls in one array, its runs per second times the calls in each, ``args.rounds`` times."""
    for (rt, size), path in models.items():
        if size != "large" or rt not in VS_MLSERVER:
            continue
        x_file = work / f"{rt}-{size}-x{BATCHED_CALLS}.npy"
        np.save(x_file, np.concatenate([xs[(rt, size)]] * BATCHED_CALLS))
        for rnd in range(1, args.rounds + 1):
            r = in_process(LOADER, rt, path, x_file, args.seconds)
            sample = {**r, "rps": r["rps"] * BATCHED_CALLS, "errors": 0}
            samples.setdefault((rt, size, *CEILING, BATCHED_CALLS), []).append(sample)
            print(f"round {rnd} ceiling: {rt} {size}, {BATCHED_CALLS} calls a run in-process "
                  f"{sample['rps']:>9,.0f} calls/s", flush=True)  # fmt: skip


def report(samples: Samples, args: argparse.Namespace) -> bool:
    targets: list[Target] = []
    for rt in RUNTIMES:
        for server in ("gateway", "gw-thread", "gw-batch"):
            who = {"gateway": "", "gw-thread": "thread ", "gw-batch": "batched "}[server]
            large, small = (rt, "large", server, "V2 JSON", 32), (rt, "small", server, "V2 JSON", 1)
            if (tp := ratio(samples, large, (rt, "large", *LOOP, 32), "rps")) is not None:
                targets.append(Target(f"{rt} {who}large c=32 vs in-process", tp, ">=", 0.8, "x"))
            # A greedy batch never holds a lone call: c=1 is the thread placement's.
            added = ratio(samples, small, (rt, "small", *LOOP, 1), "p50_us", "-")
            if added is not None and server != "gw-batch":
                targets.append(Target(f"{rt} {who}small added p50 c=1", added, "<=", 100.0, "µs"))
            if rt not in VS_MLSERVER:
                continue
            if server == "gw-batch":
                # No goal of its own: the bound the 3x goal on a large model is read against.
                bound = (rt, "large", *CEILING, BATCHED_CALLS)
                most = ratio(samples, bound, (rt, "large", "mlserver", "V2 JSON", BATCHED_CALLS), "rps")
                if most is not None:
                    what = f"{rt} large c=32: batching's ceiling vs MLServer"
                    targets.append(Target(what, most, "", None, "x"))
            for size in SIZES:
                for c in CONCURRENCY:
                    ours, theirs = (rt, size, server, "V2 JSON", c), (rt, size, "mlserver", "V2 JSON", c)
                    if c > 1 and (tp_ml := ratio(samples, ours, theirs, "rps")) is not None:
                        targets.append(Target(f"{rt} {who}{size} c={c} vs MLServer", tp_ml, ">=", 3.0, "x"))
                    if (p99 := ratio(samples, ours, theirs, "p99_us")) is not None:
                        targets.append(Target(f"{rt} {who}{size} p99 c={c} vs MLServer", p99, "<=", 0.5, "x"))
    return BENCH.finish(samples, targets, args)


if __name__ == "__main__":
    main()
