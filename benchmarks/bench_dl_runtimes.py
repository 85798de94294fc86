"""The torch, tensorflow and pmml runtimes served by the gateway, against the same library
called in-process on the same model and input.

Per runtime, two models built here (fixed seeds, no download):

  * ``small``: one row through a model whose run takes tens of microseconds (torch and
    tensorflow: one 64x10 linear layer; pmml: the samples' two-field logistic regression),
    where the gateway's own cost shows: the added p50 at c=1;
  * ``large``: a run of a millisecond or more, where throughput at c=32 should be the
    library's (torch and tensorflow: 32 rows through four 1024x1024 layers with ReLU;
    pmml: 2000 rows through the same logistic regression).

Contestants, each pinned to core 0 with wrk on core 1:

  * ``in-process``: the library's own loop (the TorchScript module under inference_mode, the
    SavedModel's signature function, sklearn-pmml-model's ``predict`` and ``predict_proba``,
    the two a PMML record answer carries; one thread), in a child process: its p50 and calls
    per second are the floor;
  * ``gateway``: V2 JSON and the EAS protobuf form (TorchRequest, TFRequest; the PMML list of
    records), the model on one worker process; ``gw-thread``: the EAS form with the model in
    the gateway's threads (``placement: thread``).

Figures, per runtime (median over rounds of per-round ratios): the gateway's throughput at
c=32 over the in-process loop's on the large model (goal >= 0.8, EAS form, worker and
threads) and the added p50 at c=1 over the in-process p50 on the small model (goal
< 100 µs, EAS form); beside it, without a goal, the CPU per call the gateway and its worker
add over the loop's (on a busy machine the p50 also holds the waits for a core).

Writes ``benchmarks/results/dl_runtimes.json``.
Usage: python benchmarks/bench_dl_runtimes.py [--rounds N] [--seconds S] [--quick] [--only torch,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import PY, ROOT, Child, Target, median, pin, report_targets, run_wrk, start_gateway, tree_pids
from bench_servers import accepted, wait_http

TOKEN = "bench-token-0123456789"
RESULTS = ROOT / "benchmarks" / "results"
CONCURRENCY = (1, 32)
RUNTIMES = ("torch", "tensorflow", "pmml")
SIZES = ("small", "large")
ROWS = {("torch", "small"): 1, ("torch", "large"): 32, ("tensorflow", "small"): 1,
        ("tensorflow", "large"): 32, ("pmml", "small"): 1, ("pmml", "large"): 2000}  # fmt: skip
WIDTH = {"small": 64, "large": 1024}
JSON_TYPE = "application/json"
PROTO_TYPE = "application/octet-stream"
ENV = {"OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}


def _layers(size: str) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    if size == "small":
        return [(rng.normal(0, 0.1, (64, 10)).astype(np.float32), np.zeros(10, np.float32))]
    return [
        (rng.normal(0, 0.03, (1024, 1024)).astype(np.float32), np.zeros(1024, np.float32)) for _ in range(4)
    ]


def build_torch(path: Path, size: str) -> None:
    import torch

    layers: list[torch.nn.Module] = []
    for w, b in _layers(size):
        lin = torch.nn.Linear(*w.shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w.T.copy()))
            lin.bias.copy_(torch.from_numpy(b))
        layers += [lin, torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers[:-1]).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript, deprecated in 2.13
        torch.jit.trace(net, torch.zeros(1, WIDTH[size])).save(str(path))


def build_tensorflow(path: Path, size: str) -> None:
    import tensorflow as tf

    weights = [(tf.constant(w), tf.constant(b)) for w, b in _layers(size)]

    class Net(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, WIDTH[size]], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            for i, (w, b) in enumerate(weights):
                x = tf.matmul(x, w) + b
                if i < len(weights) - 1:
                    x = tf.nn.relu(x)
            return {"y": x}

    net = Net()
    tf.saved_model.save(net, str(path), signatures={"serving_default": net.serve.get_concrete_function()})


def build(folder: Path, runtimes: tuple[str, ...]) -> dict[tuple[str, str], Path]:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "samples_runtimes", ROOT / "samples/runtimes/build_models.py"
    )
    assert spec is not None and spec.loader is not None
    samples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(samples)
    out: dict[tuple[str, str], Path] = {}
    folder.mkdir(parents=True, exist_ok=True)
    for size in SIZES:
        if "torch" in runtimes:
            out[("torch", size)] = folder / f"torch-{size}.pt"
            build_torch(out[("torch", size)], size)
        if "tensorflow" in runtimes:
            out[("tensorflow", size)] = folder / f"tensorflow-{size}"
            build_tensorflow(out[("tensorflow", size)], size)
        if "pmml" in runtimes:
            out[("pmml", size)] = samples.build_pmml(folder / f"pmml-{size}.pmml")
    return out


def rows_of(runtime: str, size: str) -> np.ndarray:
    n = ROWS[(runtime, size)]
    rng = np.random.default_rng(1)
    if runtime == "pmml":
        return rng.uniform(0, 5, (n, 2))
    return rng.random((n, WIDTH[size]), dtype=np.float32)


INPROC = r"""
import os, sys, time, json, warnings, numpy as np
runtime, path, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
x = np.load(sys.argv[4])
if runtime == "torch":
    import torch
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        m = torch.jit.load(path)
    def predict(a):
        with torch.inference_mode():
            return m(torch.from_numpy(a)).numpy()
elif runtime == "tensorflow":
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    fn = tf.saved_model.load(path).signatures["serving_default"]
    predict = lambda a: fn(x=tf.constant(a))["y"].numpy()
else:
    from sklearn_pmml_model.auto_detect import auto_detect_estimator
    model = auto_detect_estimator(pmml=path)
    predict = lambda a: (model.predict(a), model.predict_proba(a))  # what a record answer carries
for _ in range(50):
    predict(x)
times = []
cpu0 = time.process_time()
end = time.perf_counter() + seconds
while True:
    t0 = time.perf_counter(); predict(x); t1 = time.perf_counter()
    times.append(t1 - t0)
    if t1 > end:
        break
cpu_us = (time.process_time() - cpu0) / len(times) * 1e6
times.sort()
print(json.dumps({"rps": len(times) / sum(times), "p50_us": times[len(times) // 2] * 1e6,
                  "p99_us": times[int(len(times) * 0.99)] * 1e6, "cpu_us": cpu_us}))
"""


def in_process(runtime: str, path: Path, x_file: Path, seconds: float) -> dict[str, float]:
    env = dict(os.environ, **ENV)
    out = subprocess.run(
        [*pin(0), PY, "-c", INPROC, runtime, str(path), str(seconds), str(x_file)],
        capture_output=True, text=True, env=env, check=True, timeout=300,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def service(name: str, runtime: str, path: Path, size: str, placement: str) -> str:
    text = (f"  - name: {name}\n    token: {TOKEN}\n    processor: {runtime}\n    model: {path}\n"
            f"    workers: 1\n    placement: {placement}\n")  # fmt: skip
    if runtime == "torch":
        text += f"    inputs: {{x: {{dtype: FP32, shape: [-1, {WIDTH[size]}]}}}}\n"
    return text


def start(work: Path, models: dict[tuple[str, str], Path]) -> tuple[str, Child]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", EASGW_LOG_LEVEL="WARNING", **ENV)
    services = "".join(
        service(f"{rt}-{size}{suffix}", rt, path, size, placement)
        for (rt, size), path in models.items()
        for suffix, placement in (("", "process"), ("-thread", "thread"))
    )
    cfg = work / "services.yaml"
    cfg.write_text(
        "gateway:\n  host: 127.0.0.1\n  port: 0\n  access_log: false\n"
        f"  data_dir: {work / 'data'}\nservices:\n{services}"
    )
    gw, addr = start_gateway(cfg, env)
    for rt, size in models:
        for suffix in ("", "-thread"):
            wait_http(f"http://{addr}/v2/models/{rt}-{size}{suffix}/ready", gw, timeout=300)
    return f"http://{addr}", gw


def bodies(work: Path, name: str, runtime: str, x: np.ndarray) -> dict[str, Path]:
    """The V2 JSON body and the EAS one (the form each runtime's EAS clients send)."""
    from eas_sdk.codecs.eas import encode_tf_request, encode_torch_request

    input_name = {"torch": "x", "tensorflow": "x", "pmml": "input"}[runtime]
    output = {"torch": "output__0", "tensorflow": "y", "pmml": "predict"}[runtime]
    datatype = "FP32" if x.dtype == np.float32 else "FP64"
    doc = {
        "inputs": [
            {"name": input_name, "datatype": datatype, "shape": list(x.shape), "data": x.ravel().tolist()}
        ],
        "outputs": [{"name": output}],
    }
    files = {"json": work / f"{name}.json", "eas": work / f"{name}.eas"}
    files["json"].write_bytes(json.dumps(doc, separators=(",", ":")).encode())
    if runtime == "torch":
        files["eas"].write_bytes(encode_torch_request([x]))
    elif runtime == "tensorflow":
        files["eas"].write_bytes(encode_tf_request("serving_default", {"x": x}, ["y"]))
    else:  # what the guide's StringRequest sends a PMML service: a list of records
        records = [{"fea1": a, "fea2": b} for a, b in x.tolist()]
        files["eas"].write_bytes(json.dumps(records, separators=(",", ":")).encode())
    return files


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true", help="1 round x 1 s (smoke run)")
    ap.add_argument("--only", default=",".join(RUNTIMES), help="comma-separated runtimes")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 1.0
    runtimes = tuple(r for r in args.only.split(",") if r)
    os.environ.update(ENV)
    work = Path(tempfile.mkdtemp(prefix="easkit-bench-dl-runtimes-"))
    models = build(work / "models", runtimes)
    xs = {key: rows_of(*key) for key in models}
    x_files = {}
    for (rt, size), x in xs.items():
        x_files[(rt, size)] = work / f"{rt}-{size}.npy"
        np.save(x_files[(rt, size)], x)
    files = {key: bodies(work, f"{key[0]}-{key[1]}", key[0], x) for key, x in xs.items()}
    print("starting the gateway ...", flush=True)
    base, gw = start(work, models)
    try:
        plan: list[tuple[str, str, str, str, str, Path, list[int]]] = []
        pids = tree_pids(gw.pid)
        for rt, size in models:
            name = f"{rt}-{size}"
            v2, eas = files[(rt, size)]["json"], files[(rt, size)]["eas"]
            eas_type = JSON_TYPE if rt == "pmml" else PROTO_TYPE
            cands = [
                ("gateway", "V2 JSON", f"{base}/v2/models/{name}/infer", v2),
                ("gateway", "EAS", f"{base}/api/predict/{name}", eas),
                ("gw-thread", "EAS", f"{base}/api/predict/{name}-thread", eas),
            ]
            for server, proto, url, body in cands:
                ctype = JSON_TYPE if proto == "V2 JSON" else eas_type
                if not accepted(url, body.read_bytes(), ctype, {}):
                    raise SystemExit(f"{server} {proto} on {name}: not accepted")
                plan.append((rt, size, server, proto, url, body, pids))
        samples: dict[tuple[str, str, str, str, int], list[dict[str, float]]] = {}
        for rnd in range(args.rounds):
            for rt, size in models:
                r = in_process(rt, models[(rt, size)], x_files[(rt, size)], args.seconds)
                for c in CONCURRENCY:
                    samples.setdefault((rt, size, "in-process", "loop", c), []).append(r)
                print(f"round {rnd + 1} {rt:<11}{size:<6}in-process          {r['rps']:>9,.0f} calls/s  "
                      f"p50 {r['p50_us']:>7.0f} µs  p99 {r['p99_us']:>7.0f} µs", flush=True)  # fmt: skip
            for rt, size, server, proto, url, body, server_pids in plan:
                ctype = JSON_TYPE if proto == "V2 JSON" or rt == "pmml" else PROTO_TYPE
                for c in CONCURRENCY:
                    w = run_wrk(url, body, connections=c, seconds=args.seconds, token=TOKEN,
                                server_pids=server_pids, content_type=ctype)  # fmt: skip
                    if w.errors:  # wrk's own 2 s timeout, on a busy machine: counted and shown
                        print(f"  {server} {proto} {rt}-{size} c={c}: {w.errors} calls past wrk's timeout")
                    if w.non2xx:
                        raise SystemExit(f"{server} {proto} {rt}-{size} c={c}: {w.non2xx} non-2xx")
                    samples.setdefault((rt, size, server, proto, c), []).append(
                        {"rps": w.rps, "p50_us": w.p50_us, "p99_us": w.p99_us, "cpu_us": w.cpu_us_per_req}
                    )
                    what = f"round {rnd + 1} {rt:<11}{size:<6}{server:<10}{proto:<9}c={c:<3}"
                    print(f"{what}{w.rps:>9,.0f} req/s  p50 {w.p50_us:>7.0f} µs  p99 {w.p99_us:>7.0f} µs",
                          flush=True)  # fmt: skip
        ok = report(samples, args, runtimes)
    finally:
        gw.stop()
    raise SystemExit(0 if ok else 1)  # a missed target: exit status 1, as scripts/bench.sh reads it


def report(
    samples: dict[tuple[str, str, str, str, int], list[dict[str, float]]],
    args: Any,
    runtimes: tuple[str, ...],
) -> bool:
    rows = [
        {"runtime": rt, "model": size, "server": srv, "protocol": proto, "connections": c,
         **{k: median([s[k] for s in ss]) for k in ("rps", "p50_us", "p99_us", "cpu_us")}}
        for (rt, size, srv, proto, c), ss in samples.items()
    ]  # fmt: skip
    print(f"\n{'runtime':<12}{'model':<7}{'server':<11}{'protocol':<10}{'conn':>5}{'req/s':>10}{'p50 µs':>9}"
          f"{'p99 µs':>9}{'CPU µs':>9}")  # fmt: skip
    for r in rows:
        print(f"{r['runtime']:<12}{r['model']:<7}{r['server']:<11}{r['protocol']:<10}{r['connections']:>5}"
              f"{r['rps']:>10,.0f}{r['p50_us']:>9.0f}{r['p99_us']:>9.0f}{r['cpu_us']:>9.0f}")  # fmt: skip

    def ratio(a: tuple[Any, ...], b: tuple[Any, ...], key: str, op: str = "/") -> float | None:
        xs, ys = samples.get(a), samples.get(b)
        if not xs or not ys:
            return None
        if op == "-":
            return median([x[key] - y[key] for x, y in zip(xs, ys, strict=True)])
        return median([x[key] / y[key] for x, y in zip(xs, ys, strict=True)])

    targets: list[Target] = []
    for rt in runtimes:
        for server in ("gateway", "gw-thread"):
            who = "" if server == "gateway" else "thread "
            floor = (rt, "large", "in-process", "loop", 32)
            if (tp := ratio((rt, "large", server, "EAS", 32), floor, "rps")) is not None:
                targets.append(Target(f"{rt} {who}large c=32 vs in-process", tp, ">=", 0.8, "x"))
            floor = (rt, "small", "in-process", "loop", 1)
            if (added := ratio((rt, "small", server, "EAS", 1), floor, "p50_us", "-")) is not None:
                targets.append(Target(f"{rt} {who}small added p50 c=1", added, "<=", 100.0, "µs"))
            # CPU per call (the gateway and its worker) over the loop's: what a busy machine's
            # scheduling adds to the p50 above is not in it.
            if (cpu := ratio((rt, "small", server, "EAS", 1), floor, "cpu_us", "-")) is not None:
                targets.append(Target(f"{rt} {who}small added CPU per call c=1", cpu, "", None, "µs"))
        if tp := ratio(
            (rt, "large", "gateway", "V2 JSON", 32), (rt, "large", "in-process", "loop", 32), "rps"
        ):
            targets.append(Target(f"{rt} large V2 JSON c=32 vs in-process", tp, "", None, "x"))
    ok = report_targets("bench_dl_runtimes", targets)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "dl_runtimes.json"
    out.write_text(json.dumps({"rounds": args.rounds, "seconds": args.seconds, "rows": rows,
                               "targets": [t.__dict__ for t in targets]}, indent=1))  # fmt: skip
    print(f"\nwrote {out.relative_to(ROOT)}")
    return ok


if __name__ == "__main__":
    main()
