"""The comparison users make when choosing a server: the gateway vs KServe and MLServer.

The same ONNX models (the digits MLP and a 1x3x224x224 convolutional model) run with
ONNX Runtime (one intra-op thread) in each server, pinned to core 0, with wrk on core 1:

  * this gateway: V2 JSON, V2 binary (the binary tensor extension) and the EAS TFRequest path,
    the model on a worker process (``gateway``: ``placement: process``), V2 JSON and V2 binary
    with the model in the gateway's own threads (``gw-thread``: ``placement: thread``), and
    V2 JSON as a user writes the service without tuning (``gw-default``: no ``placement``);
  * KServe 0.21 ModelServer (``.venv-clients``): V2 JSON and V2 binary, one uvicorn worker on
    uvloop, no gRPC server, latency logging off;
  * MLServer 1.7 (``.venv-mlserver``): V2 JSON, ``parallel_workers: 0``, httptools installed,
    gzip and metrics off.

Each scenario is measured at 1 and 32 connections in interleaved rounds; the ratios are
taken within a round and the median over rounds is reported. Goals, on the digits model's
V2 JSON path with the same request: throughput >= 4x KServe's and >= 3x MLServer's, p99 at
most half of theirs at both concurrencies; reported for each placement of the model.

Writes ``benchmarks/results/servers.json`` and, when matplotlib is installed, ``servers.png``.
Usage: python benchmarks/bench_servers.py [--rounds N] [--seconds S] [--quick]
    [--models digits] [--protocols "V2 JSON"] (only those scenarios: a short run, whose
    figures are printed, not written)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import (
    ROOT,
    TOKEN,
    Child,
    Target,
    free_port,
    median,
    pin,
    report_targets,
    run_wrk,
    start_gateway,
    tree_pids,
)

RESULTS = ROOT / "benchmarks" / "results"
KSERVE_PY = ROOT / ".venv-clients" / "bin" / "python"
MLSERVER = ROOT / ".venv-mlserver" / "bin" / "mlserver"
CONCURRENCY = (1, 32)
THREAD_SUFFIX = "-thread"  # the gateway's service of the same model with placement: thread
DEFAULT_SUFFIX = "-default"  # and with no placement: what the gateway chooses by itself
OURS = ("gateway", "gw-thread", "gw-default")
JSON_TYPE = "application/json"


def build_conv(path: Path) -> Path:
    """A small convolutional classifier over a 1x3x224x224 image (made here, not downloaded)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.1, (8, 3, 3, 3)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.normal(0, 0.1, (8, 10)).astype(np.float32), "fc")
    nodes = [
        helper.make_node("Conv", ["image", "w"], ["c"], strides=[4, 4], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "conv224",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])],
        [w, fc],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@dataclass
class Scenario:
    model: str
    server: str
    protocol: str
    url: str
    body: Path
    content_type: str
    headers: dict[str, str]
    pids: list[int]


def v2_json(name: str, x: np.ndarray) -> bytes:
    doc = {"inputs": [{"name": name, "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    return json.dumps(doc, separators=(",", ":")).encode()


def v2_binary(name: str, x: np.ndarray) -> tuple[bytes, int]:
    head = {
        "inputs": [
            {
                "name": name,
                "datatype": "FP32",
                "shape": list(x.shape),
                "parameters": {"binary_data_size": x.nbytes},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    h = json.dumps(head, separators=(",", ":")).encode()
    return h + x.astype("<f4").tobytes(), len(h)


def tf_request(name: str, x: np.ndarray) -> bytes:
    from eas_sdk.codecs.eas import encode_tf_request

    return encode_tf_request("predict", {name: x})


def accepted(url: str, body: bytes, content_type: str, headers: dict[str, str]) -> bool:
    req = urllib.request.Request(url, data=body, method="POST")
    req.add_header("Content-Type", content_type)
    req.add_header("Authorization", TOKEN)
    for k, v in headers.items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_http(url: str, child: Child, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise SystemExit(f"{url}: the server exited:\n{child.output()[-3000:]}")
        try:
            req = urllib.request.Request(url, headers={"Authorization": TOKEN})
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise SystemExit(f"{url} not ready after {timeout:.0f} s:\n{child.output()[-3000:]}")


def start_mlserver(root: Path, models: dict[str, tuple[str, Path]], env: dict[str, str]) -> tuple[str, Child]:
    """MLServer serving each NAME -> (its runtime's implementation, the model file) from ``root``,
    pinned to core 0, one process (``parallel_workers: 0``), gzip and metrics off: its base URL
    and the child, once every model is ready."""
    port = free_port()
    for name, (implementation, path) in models.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        settings = {"name": name, "implementation": implementation, "parameters": {"uri": str(path)}}
        (root / name / "model-settings.json").write_text(json.dumps(settings))
    (root / "settings.json").write_text(
        json.dumps(
            {
                "debug": False,
                "parallel_workers": 0,
                "host": "127.0.0.1",
                "http_port": port,
                "grpc_port": free_port(),
                "metrics_port": free_port(),
                "metrics_endpoint": None,
                "gzip_enabled": False,
            }
        )
    )
    ml = Child([*pin(0), str(MLSERVER), "start", str(root)], env=env, cwd=root)
    try:
        for name in models:
            wait_http(f"http://127.0.0.1:{port}/v2/models/{name}/ready", ml)
    except BaseException:
        ml.stop()
        raise
    return f"http://127.0.0.1:{port}", ml


def start_servers(work: Path, models: dict[str, tuple[Path, str]]) -> tuple[dict[str, Any], list[Child]]:
    children: list[Child] = []
    env = dict(os.environ, PYTHONUNBUFFERED="1", EASGW_LOG_LEVEL="WARNING")
    cfg = work / "services.yaml"
    # Each model three times: on a worker process, in the gateway's threads (<name>-thread),
    # and where the gateway puts it by default (<name>-default).
    services = "".join(
        f"  - name: {name}{suffix}\n    token: {TOKEN}\n    processor: onnx\n    model: {path}\n"
        f"    workers: 1\n{placement}"
        for name, (path, _) in models.items()
        for suffix, placement in (
            ("", "    placement: process\n"),
            (THREAD_SUFFIX, "    placement: thread\n"),
            (DEFAULT_SUFFIX, ""),
        )
    )
    cfg.write_text(
        "gateway:\n  host: 127.0.0.1\n  port: 0\n  access_log: false\n"
        f"  data_dir: {work / 'data'}\nservices:\n{services}"
    )
    gw, addr = start_gateway(cfg, env)
    children.append(gw)
    bases: dict[str, Any] = {server: (f"http://{addr}", gw) for server in OURS}
    for name in models:
        for suffix in ("", THREAD_SUFFIX, DEFAULT_SUFFIX):
            wait_http(f"{bases['gateway'][0]}/v2/models/{name}{suffix}/ready", gw)

    if KSERVE_PY.exists():
        for name, (path, _) in models.items():
            port = free_port()
            ks = Child(
                [*pin(0), str(KSERVE_PY), str(ROOT / "benchmarks" / "servers" / "kserve_onnx.py"),
                 "--name", name, "--model", str(path), "--port", str(port)],
                env=env,
            )  # fmt: skip
            children.append(ks)
            wait_http(f"http://127.0.0.1:{port}/v2/models/{name}/ready", ks)
            bases[f"kserve:{name}"] = (f"http://127.0.0.1:{port}", ks)
    if MLSERVER.exists():
        onnx = {name: ("mlserver_onnx.OnnxRuntimeModel", path) for name, (path, _) in models.items()}
        ml_env = dict(env, PYTHONPATH=str(ROOT / "benchmarks" / "servers"))
        ml_base, ml = start_mlserver(work / "mlserver", onnx, ml_env)
        children.append(ml)
        bases["mlserver"] = (ml_base, ml)
    return bases, children


def scenarios(
    work: Path, models: dict[str, tuple[Path, str]], bases: dict[str, Any], protocols: list[str]
) -> list[Scenario]:
    out: list[Scenario] = []
    for name, (_, input_name) in models.items():
        shape = (1, 64) if name == "digits" else (1, 3, 224, 224)
        x = np.random.default_rng(1).uniform(0, 16, shape).astype(np.float32)
        files = {}
        for kind, data in (("json", v2_json(input_name, x)), ("tf", tf_request(input_name, x))):
            files[kind] = work / f"{name}.{kind}"
            files[kind].write_bytes(data)
        binary, head_len = v2_binary(input_name, x)
        files["binary"] = work / f"{name}.binary"
        files["binary"].write_bytes(binary)
        bin_headers = {"Inference-Header-Content-Length": str(head_len)}

        candidates: list[tuple[str, str, str, str, dict[str, str]]] = []
        gw_base = bases["gateway"][0]
        v2 = f"/v2/models/{name}/infer"
        candidates += [
            ("gateway", "V2 JSON", gw_base + v2, "json", {}),
            ("gateway", "V2 binary", gw_base + v2, "binary", bin_headers),
            ("gateway", "EAS TFRequest", f"{gw_base}/api/predict/{name}", "tf", {}),
            ("gw-thread", "V2 JSON", f"{gw_base}/v2/models/{name}{THREAD_SUFFIX}/infer", "json", {}),
            (
                "gw-thread",
                "V2 binary",
                f"{gw_base}/v2/models/{name}{THREAD_SUFFIX}/infer",
                "binary",
                bin_headers,
            ),
            ("gw-default", "V2 JSON", f"{gw_base}/v2/models/{name}{DEFAULT_SUFFIX}/infer", "json", {}),
        ]
        if f"kserve:{name}" in bases:
            ks_base = bases[f"kserve:{name}"][0]
            candidates += [
                ("kserve", "V2 JSON", ks_base + v2, "json", {}),
                ("kserve", "V2 binary", ks_base + v2, "binary", bin_headers),
            ]
        if "mlserver" in bases:
            candidates.append(("mlserver", "V2 JSON", bases["mlserver"][0] + v2, "json", {}))
        for server, protocol, url, kind, headers in candidates:
            if protocols and protocol not in protocols:
                continue
            # KServe parses a binary V2 body only as application/octet-stream (as tritonclient sends it).
            ctype = JSON_TYPE if kind == "json" else "application/octet-stream"
            if not accepted(url, files[kind].read_bytes(), ctype, headers):
                print(f"  skipped: {server} {protocol} on {name} (not accepted)", flush=True)
                continue
            child = bases[f"kserve:{name}" if server == "kserve" else server][1]
            pids = tree_pids(child.pid)
            out.append(Scenario(name, server, protocol, url, files[kind], ctype, headers, pids))
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = sorted({r["model"] for r in rows})
    panels = [(m, c) for m in models for c in CONCURRENCY]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (model, c) in zip(np.ravel(axes), panels, strict=True):
        sel = [r for r in rows if r["model"] == model and r["connections"] == c]
        labels = [f"{r['server']}\n{r['protocol']}" for r in sel]
        colors = ["#2a7" if r["server"] in OURS else "#888" for r in sel]
        ax.bar(labels, [r["rps"] for r in sel], color=colors)
        ax.set_title(f"{model}, {c} connection(s)")
        ax.set_ylabel("requests/s")
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true", help="1 round x 1 s (smoke run)")
    ap.add_argument("--models", nargs="+", choices=("digits", "conv224"), help="only these models")
    ap.add_argument(
        "--protocols", nargs="+", help='only these protocols ("V2 JSON", "V2 binary", "EAS TFRequest")'
    )
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 1.0

    sys.path.insert(0, str(ROOT / "samples"))
    import build_models  # type: ignore[import-not-found]

    work = Path(tempfile.mkdtemp(prefix="easkit-bench-servers-"))
    built = build_models.build_all(work / "models")
    models = {
        "digits": (Path(built["digits"]), build_models.DIGITS_INPUT),
        "conv224": (build_conv(work / "models" / "conv224.onnx"), "image"),
    }
    models = {name: model for name, model in models.items() if not args.models or name in args.models}
    print("starting the gateway, KServe and MLServer ...", flush=True)
    bases, children = start_servers(work, models)
    try:
        plan = scenarios(work, models, bases, args.protocols or [])
        samples: dict[tuple[str, str, str, int], list[Any]] = {}
        for rnd in range(args.rounds):
            for s in plan:
                for c in CONCURRENCY:
                    seconds = args.seconds if s.model == "digits" else args.seconds * 1.5
                    r = run_wrk(
                        s.url, s.body, connections=c, seconds=seconds, token=TOKEN,
                        server_pids=s.pids, content_type=s.content_type, headers=s.headers,
                    )  # fmt: skip
                    if r.non2xx or r.errors:
                        what = f"{s.server} {s.protocol} {s.model}"
                        raise SystemExit(f"{what}: {r.non2xx} non-2xx, {r.errors} socket errors")
                    samples.setdefault((s.model, s.server, s.protocol, c), []).append(r)
                    print(
                        f"round {rnd + 1}/{args.rounds} {s.model:<8}{s.server:<11}{s.protocol:<14}c={c:<3}"
                        f"{r.rps:>9,.0f} req/s  p50 {r.p50_us:>8.0f} µs  p99 {r.p99_us:>8.0f} µs",
                        flush=True,
                    )
        rows = [
            {
                "model": m, "server": srv, "protocol": proto, "connections": c,
                "rps": median([x.rps for x in rs]), "p50_us": median([x.p50_us for x in rs]),
                "p99_us": median([x.p99_us for x in rs]),
                "cpu_us_per_req": median([x.cpu_us_per_req for x in rs]),
            }
            for (m, srv, proto, c), rs in samples.items()
        ]  # fmt: skip
        report(rows, samples, args)
    finally:
        for child in children:
            child.stop()


Samples = dict[tuple[str, str, str, int], list[Any]]


def report(rows: list[dict[str, Any]], samples: Samples, args: Any) -> None:
    print(f"\n{'model':<9}{'server':<12}{'protocol':<15}{'conn':>5}{'req/s':>10}{'p50 µs':>10}{'p99 µs':>10}"
          f"{'CPU µs/req':>12}")  # fmt: skip
    for r in rows:
        print(
            f"{r['model']:<9}{r['server']:<12}{r['protocol']:<15}{r['connections']:>5}{r['rps']:>10,.0f}"
            f"{r['p50_us']:>10.0f}{r['p99_us']:>10.0f}{r['cpu_us_per_req']:>12.0f}"
        )
    goals: list[dict[str, Any]] = []
    for server in OURS:
        # The worker-process rows keep their old names; the thread rows say so.
        who = "" if server == "gateway" else f"{server} "
        for other, want in (("kserve", 4.0), ("mlserver", 3.0)):
            for c in CONCURRENCY:
                ours = samples.get(("digits", server, "V2 JSON", c))
                theirs = samples.get(("digits", other, "V2 JSON", c))
                if not ours or not theirs:
                    continue
                tp = median([a.rps / b.rps for a, b in zip(ours, theirs, strict=True)])
                p99 = median([a.p99_us / b.p99_us for a, b in zip(ours, theirs, strict=True)])
                if c > 1:  # a throughput goal under load; at one connection latency decides
                    goals.append({"figure": f"{who}digits V2 JSON throughput vs {other}, c={c}", "value": tp,
                                  "goal": f">= {want:.0f}x", "pass": tp >= want})  # fmt: skip
                goals.append({"figure": f"{who}digits V2 JSON p99 vs {other}, c={c}", "value": p99,
                              "goal": "<= 0.5x", "pass": p99 <= 0.5})  # fmt: skip
    print("\nratios (median of per-round ratios):")
    for g in goals:
        verdict = "pass" if g["pass"] else "MISS"
        print(f"  {g['figure']:<56}{g['value']:>7.2f}x   goal {g['goal']:<8}{verdict}")
    targets = [
        Target(
            f"servers: {g['figure']}",
            g["value"],
            g["goal"].split()[0],
            float(g["goal"].split()[1].rstrip("x")),
            "x",
        )
        for g in goals
    ]
    report_targets("bench_servers", targets)
    if args.models or args.protocols:  # a partial run does not replace the full one's figures
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "servers.json"
    doc = {"rounds": args.rounds, "seconds": args.seconds, "rows": rows, "goals": goals}
    out.write_text(json.dumps(doc, indent=1))
    png = RESULTS / "servers.png"
    print(f"\nwrote {out.relative_to(ROOT)}" + (f" and {png.relative_to(ROOT)}" if plot(rows, png) else
          " (install matplotlib for the plot)"))  # fmt: skip


if __name__ == "__main__":
    main()
