"""What the runtime benchmarks (bench_runtimes.py, bench_dl_runtimes.py) share: a gateway with
two services of each model, each model's in-process loop measured right before the gateway's
calls of it in every round, the table of medians and the ratios taken within a round.

A sample is keyed ``(runtime, model size, server, protocol, connections)``; the in-process
loop is the server ``in-process`` with the protocol ``loop``, recorded under every
concurrency so that a ratio pairs it with each of the servers' runs.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from _harness import PY, ROOT, TOKEN, checked, median, pin, report_targets, run_wrk, start_gateway
from bench_servers import CONCURRENCY, RESULTS, accepted, wait_http

if TYPE_CHECKING:
    from _harness import Child, Target

Model = tuple[str, str]  # (runtime, model size)
Key = tuple[str, str, str, str, int]  # (runtime, model size, server, protocol, connections)
Samples = dict[Key, list[dict[str, float]]]
LOOP = ("in-process", "loop")  # the (server, protocol) of a model's in-process loop

# The child's head and tail around a benchmark's loader, which sets ``predict`` from
# ``runtime`` and ``path``: 50 warm-up calls, then calls for ``seconds``, one at a time.
_LOOP_HEAD = r"""
import sys, time, json, numpy as np
runtime, path, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
x = np.load(sys.argv[4])
"""
_LOOP_TAIL = r"""
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


def in_process(loader: str, runtime: str, path: Path, x_file: Path, seconds: float) -> dict[str, float]:
    """The library's own loop over ``x_file``'s rows in a child pinned to core 0, one thread:
    its calls per second, p50, p99 and CPU per call (µs)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [*pin(0), PY, "-c", _LOOP_HEAD + loader + _LOOP_TAIL, runtime, str(path), str(seconds), str(x_file)],
        capture_output=True, text=True, env=env, check=True, timeout=300,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def v2_body(path: Path, input_name: str, output: str, x: np.ndarray) -> Path:
    """``x`` as a V2 JSON inference request asking for ``output``, written to ``path``."""
    datatype = "FP32" if x.dtype == np.float32 else "FP64"
    doc = {
        "inputs": [
            {"name": input_name, "datatype": datatype, "shape": list(x.shape), "data": x.ravel().tolist()}
        ],
        "outputs": [{"name": output}],
    }
    path.write_bytes(json.dumps(doc, separators=(",", ":")).encode())
    return path


def gateway_env() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1", EASGW_LOG_LEVEL="WARNING", OMP_NUM_THREADS="1")


# The dynamic batching of the ``-batch`` services: greedy (a lone call never waits), so a call
# at c=1 runs as it would unbatched and under load the calls queued meanwhile share a run. Up
# to 2048 rows a run: every call of the 32 in flight, at the large models' 64 rows a call (a
# random forest's predict has a large fixed cost, which a batch of 4 calls would pay 8 times).
BATCH_ROWS = 2048
BATCHING = f"    batching: {{max_batch_size: {BATCH_ROWS}, max_latency_ms: 0}}\n"


# The gateway's busy-poll window (gateway.busy_poll_us), its setting for callers one at a
# time: longer than wrk's turnaround between an answer and its next call (about 20 µs), and
# than the worker's answer at c=1, so at c=1 its loop never sleeps between calls.
BUSY_POLL_US = 300


def start_services(
    work: Path,
    models: dict[Model, Path],
    extra: dict[Model, str] | None = None,
    *,
    batched: bool = False,
    busy_poll_us: int = BUSY_POLL_US,
) -> tuple[str, Child]:
    """A gateway serving each model twice, ``<runtime>-<size>`` on one worker process and
    ``<runtime>-<size>-thread`` in the gateway's threads, and with ``batched`` a third time,
    ``<runtime>-<size>-batch``: in the gateway's threads with dynamic batching (``extra``:
    more lines of a model's services), from ``WORK/models``: its base URL and the child, once
    every service is ready. ``busy_poll_us``: the gateway's busy-poll window (0: off)."""
    variants = [("", "process", ""), ("-thread", "thread", "")]
    if batched:
        variants.append(("-batch", "thread", BATCHING))
    services = "".join(
        f"  - name: {rt}-{size}{suffix}\n    token: {TOKEN}\n    processor: {rt}\n    model: {path}\n"
        f"    workers: 1\n    placement: {placement}\n" + more + (extra or {}).get((rt, size), "")
        for (rt, size), path in models.items()
        for suffix, placement, more in variants
    )
    cfg = work / "services.yaml"
    cfg.write_text(
        f"gateway:\n  host: 127.0.0.1\n  port: 0\n  access_log: false\n  busy_poll_us: {busy_poll_us}\n"
        f"  data_dir: {work / 'data'}\n  model_dirs: [{work / 'models'}]\nservices:\n{services}"
    )
    gw, addr = start_gateway(cfg, gateway_env())
    try:
        for rt, size in models:
            for suffix, _, _ in variants:
                wait_http(f"http://{addr}/v2/models/{rt}-{size}{suffix}/ready", gw, timeout=300)
    except BaseException:
        gw.stop()
        raise
    return f"http://{addr}", gw


@dataclass
class Call:
    """One server's endpoint for one model, measured at each concurrency in every round."""

    runtime: str
    size: str
    server: str
    proto: str
    url: str
    body: Path
    content_type: str
    pids: list[int]
    reference: bool = False  # another project's server: its failed calls are counted, not the end of the run

    @property
    def what(self) -> str:
        return f"{self.server} {self.proto} {self.runtime}-{self.size}"


def _round_line(rnd: int, what: str, r: dict[str, float], unit: str) -> None:
    print(f"round {rnd} {what}{r['rps']:>9,.0f} {unit}  p50 {r['p50_us']:>7.0f} µs  "
          f"p99 {r['p99_us']:>7.0f} µs", flush=True)  # fmt: skip


@dataclass(frozen=True)
class Bench:
    """One runtime benchmark: what it is called, what it measures its calls against and how
    it treats their failures."""

    name: str  # in its targets' report (scripts/bench.sh's summary)
    results: str  # its file under benchmarks/results
    runtimes: tuple[str, ...]
    loader: str  # the in-process loop's code that sets ``predict`` from ``runtime`` and ``path``
    cpu_column: bool  # its table shows the server CPU per call
    socket_errors_ok: bool  # our gateway's wrk timeouts are counted, not the end of the run
    skip_refused: bool  # a call a server refuses is skipped, not the end of the run

    @property
    def width(self) -> int:
        """The runtime's column in the round lines (the table's is one wider)."""
        return max(map(len, self.runtimes)) + 1

    def admitted(self, calls: Iterable[Call]) -> list[Call]:
        """The calls whose server answers the body with a 200; one it refuses is skipped (said
        so) or, unless ``skip_refused``, the end of the run."""
        out = []
        for call in calls:
            if accepted(call.url, call.body.read_bytes(), call.content_type, {}):
                out.append(call)
            elif self.skip_refused:
                print(f"  skipped: {call.server} {call.proto} on {call.runtime}-{call.size} (not accepted)",
                      flush=True)  # fmt: skip
            else:
                raise SystemExit(f"{call.server} {call.proto} on {call.runtime}-{call.size}: not accepted")
        return out

    def measure(
        self,
        calls: Iterable[Call],
        models: dict[Model, Path],
        xs: dict[Model, np.ndarray],
        work: Path,
        args: Any,
    ) -> Samples:
        """``args.rounds`` rounds of every admitted call at each concurrency for
        ``args.seconds``, each model's in-process loop over its input ``xs`` right before its
        first call, so that a ratio compares moments close together on a machine whose load
        changes. A non-2xx from our gateway ends the run, and so does a socket error (wrk's
        timeout) unless ``socket_errors_ok``; the failures a run goes on with are counted."""
        plan = self.admitted(calls)
        x_files = {}
        for (rt, size), x in xs.items():
            x_files[(rt, size)] = work / f"{rt}-{size}.npy"
            np.save(x_files[(rt, size)], x)
        width = self.width
        samples: Samples = {}
        for rnd in range(1, args.rounds + 1):
            done: set[Model] = set()
            for call in plan:
                rt, size = call.runtime, call.size
                if (rt, size) not in done:
                    done.add((rt, size))
                    r = in_process(self.loader, rt, models[(rt, size)], x_files[(rt, size)], args.seconds)
                    for c in CONCURRENCY:
                        samples.setdefault((rt, size, *LOOP, c), []).append(r)
                    _round_line(rnd, f"{rt:<{width}}{size:<6}in-process          ", r, "calls/s")
                for c in CONCURRENCY:
                    w = run_wrk(call.url, call.body, connections=c, seconds=args.seconds, token=TOKEN,
                                server_pids=call.pids, content_type=call.content_type)  # fmt: skip
                    if not call.reference:
                        checked(f"{call.what} c={c}", w, socket_errors_ok=self.socket_errors_ok)
                    if w.non2xx or w.errors:
                        print(f"  {call.what} c={c}: {w.non2xx} non-2xx, {w.errors} socket errors"
                              " (wrk's 2 s timeout), counted", flush=True)  # fmt: skip
                    sample = {"rps": w.rps, "p50_us": w.p50_us, "p99_us": w.p99_us,
                              "cpu_us": w.cpu_us_per_req, "errors": w.non2xx + w.errors}  # fmt: skip
                    samples.setdefault((rt, size, call.server, call.proto, c), []).append(sample)
                    what = f"{rt:<{width}}{size:<6}{call.server:<10}{call.proto:<9}c={c:<3}"
                    _round_line(rnd, what, sample, "req/s")
        return samples

    def finish(self, samples: Samples, targets: list[Target], args: Any) -> bool:
        """Print the medians over rounds, one row a key, and the targets (:func:`report_targets`),
        write both to ``benchmarks/results/<results>`` and say whether every goal was met."""
        rows = [
            {"runtime": rt, "model": size, "server": srv, "protocol": proto, "connections": c,
             **{k: median([s[k] for s in ss]) for k in ("rps", "p50_us", "p99_us", "cpu_us")},
             "errors": sum(s.get("errors", 0) for s in ss)}
            for (rt, size, srv, proto, c), ss in samples.items()
        ]  # fmt: skip
        w, cpu = self.width + 1, self.cpu_column
        print(f"\n{'runtime':<{w}}{'model':<7}{'server':<11}{'protocol':<10}{'conn':>5}{'req/s':>10}"
              f"{'p50 µs':>9}{'p99 µs':>9}" + (f"{'CPU µs':>9}" if cpu else ""))  # fmt: skip
        for r in rows:
            print(f"{r['runtime']:<{w}}{r['model']:<7}{r['server']:<11}{r['protocol']:<10}"
                  f"{r['connections']:>5}{r['rps']:>10,.0f}{r['p50_us']:>9.0f}{r['p99_us']:>9.0f}"
                  + (f"{r['cpu_us']:>9.0f}" if cpu else "")
                  + (f"  {r['errors']:.0f} failed calls" if r["errors"] else ""))  # fmt: skip
        ok = report_targets(self.name, targets)
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / self.results
        out.write_text(json.dumps({"rounds": args.rounds, "seconds": args.seconds, "rows": rows,
                                   "targets": [t.__dict__ for t in targets]}, indent=1))  # fmt: skip
        print(f"\nwrote {out.relative_to(ROOT)}")
        return ok


def ratio(samples: Samples, a: Key, b: Key, key: str, op: str = "/") -> float | None:
    """``a``'s figure ``key`` over ``b``'s (``op`` ``"-"``: less ``b``'s), taken in each round,
    the median over rounds; None where either was not measured."""
    xs, ys = samples.get(a), samples.get(b)
    if not xs or not ys:
        return None
    if op == "-":
        return median([x[key] - y[key] for x, y in zip(xs, ys, strict=True)])
    return median([x[key] / y[key] for x, y in zip(xs, ys, strict=True)])
