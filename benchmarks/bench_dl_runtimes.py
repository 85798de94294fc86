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
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import ROOT, Target, quick_rounds, round_options, tree_pids
from _runtimes_common import LOOP, Bench, Call, Samples, ratio, start_services, v2_body
from bench_servers import JSON_TYPE

RUNTIMES = ("torch", "tensorflow", "pmml")
SIZES = ("small", "large")
ROWS = {("torch", "small"): 1, ("torch", "large"): 32, ("tensorflow", "small"): 1,
        ("tensorflow", "large"): 32, ("pmml", "small"): 1, ("pmml", "large"): 2000}  # fmt: skip
WIDTH = {"small": 64, "large": 1024}
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


LOADER = r"""
import warnings
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
"""
# Every call must be answered, but wrk's 2 s timeouts on a busy machine are counted, not the end
# of the run; the table shows the CPU per call beside the latencies.
BENCH = Bench("bench_dl_runtimes", "dl_runtimes.json", RUNTIMES, LOADER, cpu_column=True,
              socket_errors_ok=True, skip_refused=False)  # fmt: skip


def bodies(work: Path, name: str, runtime: str, x: np.ndarray) -> dict[str, Path]:
    """The V2 JSON body and the EAS one (the form each runtime's EAS clients send)."""
    from eas_sdk.codecs.eas import encode_tf_request, encode_torch_request

    input_name = {"torch": "x", "tensorflow": "x", "pmml": "input"}[runtime]
    output = {"torch": "output__0", "tensorflow": "y", "pmml": "predict"}[runtime]
    files = {"json": v2_body(work / f"{name}.json", input_name, output, x), "eas": work / f"{name}.eas"}
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
    round_options(ap, rounds=2, seconds=3.0, connections=None, quick_seconds=1.0)
    ap.add_argument("--only", default=",".join(RUNTIMES), help="comma-separated runtimes")
    args = quick_rounds(ap.parse_args())
    runtimes = tuple(r for r in args.only.split(",") if r)
    os.environ.update(ENV)
    work = Path(tempfile.mkdtemp(prefix="easkit-bench-dl-runtimes-"))
    models = build(work / "models", runtimes)
    xs = {key: rows_of(*key) for key in models}
    files = {key: bodies(work, f"{key[0]}-{key[1]}", key[0], x) for key, x in xs.items()}
    print("starting the gateway ...", flush=True)
    # A TorchScript module carries no signature: its services declare their input.
    inputs = {
        ("torch", size): f"    inputs: {{x: {{dtype: FP32, shape: [-1, {WIDTH[size]}]}}}}\n" for size in SIZES
    }
    base, gw = start_services(work, models, inputs)
    try:
        calls: list[Call] = []
        pids = tree_pids(gw.pid)
        for rt, size in models:
            name = f"{rt}-{size}"
            v2, eas = files[(rt, size)]["json"], files[(rt, size)]["eas"]
            eas_type = JSON_TYPE if rt == "pmml" else PROTO_TYPE
            calls += [
                Call(rt, size, "gateway", "V2 JSON", f"{base}/v2/models/{name}/infer", v2, JSON_TYPE, pids),
                Call(rt, size, "gateway", "EAS", f"{base}/api/predict/{name}", eas, eas_type, pids),
                Call(rt, size, "gw-thread", "EAS", f"{base}/api/predict/{name}-thread", eas, eas_type, pids),
            ]
        samples = BENCH.measure(calls, models, xs, work, args)
        ok = report(samples, args, runtimes)
    finally:
        gw.stop()
    raise SystemExit(0 if ok else 1)  # a missed target: exit status 1, as scripts/bench.sh reads it


def report(samples: Samples, args: argparse.Namespace, runtimes: tuple[str, ...]) -> bool:
    targets: list[Target] = []
    for rt in runtimes:
        large_floor, small_floor = (rt, "large", *LOOP, 32), (rt, "small", *LOOP, 1)
        for server in ("gateway", "gw-thread"):
            who = "" if server == "gateway" else "thread "
            large, small = (rt, "large", server, "EAS", 32), (rt, "small", server, "EAS", 1)
            if (tp := ratio(samples, large, large_floor, "rps")) is not None:
                targets.append(Target(f"{rt} {who}large c=32 vs in-process", tp, ">=", 0.8, "x"))
            if (added := ratio(samples, small, small_floor, "p50_us", "-")) is not None:
                targets.append(Target(f"{rt} {who}small added p50 c=1", added, "<=", 100.0, "µs"))
            # CPU per call (the gateway and its worker) over the loop's: what a busy machine's
            # scheduling adds to the p50 above is not in it.
            if (cpu := ratio(samples, small, small_floor, "cpu_us", "-")) is not None:
                targets.append(Target(f"{rt} {who}small added CPU per call c=1", cpu, "", None, "µs"))
        if tp := ratio(samples, (rt, "large", "gateway", "V2 JSON", 32), large_floor, "rps"):
            targets.append(Target(f"{rt} large V2 JSON c=32 vs in-process", tp, "", None, "x"))
    return BENCH.finish(samples, targets, args)


if __name__ == "__main__":
    main()
