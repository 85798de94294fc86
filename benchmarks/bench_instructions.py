"""The gateway's own work per call, counted in CPU instructions instead of timed.

A latency on a shared 2-core VM moves by a third from one run to the next, and with it
every "added p50": too much to tell whether a change to the gateway's request path saved
a few microseconds. Instructions executed do not move with the machine. Here each program
runs under Valgrind's callgrind with its counting switched off; it is switched on
(``callgrind_control -i on``) only around a fixed number of calls made one at a time, and
the count for those calls is read from callgrind's dump. Every thread of the process is
counted: the event loop, a compute thread, the model library's own threads.

Counted, per call, on the small models of bench_runtimes.py (digits, one row):

  * ``library``: the library's own loop on the loaded file, the call bench_runtimes.py
    times in-process (scikit-learn's ``predict``, the XGBoost Booster's ``inplace_predict``
    and an argmax, LightGBM's ``Booster.predict``);
  * ``gateway``: the same model served in the gateway's threads (``placement: thread``, the
    setting where all of a call's work is in one process), called over HTTP/1.1 with V2 JSON
    and with the EAS TFRequest; ``own`` is that count less the library's: the gateway's
    own work on the call (HTTP, token, route, admission, codec in and out, metrics);
  * ``floor``: the gateway's lean HTTP front alone (front_floor_server.py) answering each
    call at once: what any call through that front costs, in the ``own`` count too.

The client runs outside Valgrind and waits for each answer before the next call, so no
two calls overlap and the counts do not depend on how fast the machine is. What is left
to vary (a TCP segment split differently, a timer firing between two calls) moves a count
by well under one per cent between rounds.

Needs Valgrind (``apt-get install valgrind``; scripts/bench.sh installs it). Under
callgrind a program runs about fifty times slower: the gateway takes a minute or two to
start, and a round about three minutes.

Writes ``benchmarks/results/instructions.json``.
Usage: python benchmarks/bench_instructions.py [--rounds N] [--calls N] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import PY, ROOT, TOKEN, Child, Target, free_port, median, report_targets, round_options
from _runtimes_common import gateway_env, v2_body
from bench_runtimes import LOADER, RUNTIMES, bodies, build, rows_of

RESULTS = ROOT / "benchmarks" / "results" / "instructions.json"
WARM_UP = 50  # calls before counting: imports, caches and specialised bytecode settle
SIZE = "small"
FLOOR_PATH = "/api/predict/floor"


def callgrind(out: Path) -> list[str]:
    """argv prefix: run under callgrind, counting nothing until told, dumps to ``out``.N."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]


def control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=120)


class Counter:
    """One process under callgrind: counts the instructions of what :meth:`count` runs."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid = pid
        self.out = out
        self.dumps = 0

    def count(self, work: Callable[[], None], calls: int) -> float:
        """Instructions per call of ``work()``, which makes ``calls`` calls."""
        control(self.pid, "-i", "on")
        work()
        control(self.pid, "-i", "off")
        control(self.pid, "-d")  # writes OUT.N with the counts since the last dump, and zeroes them
        self.dumps += 1
        dump = Path(f"{self.out}.{self.dumps}")
        deadline = time.monotonic() + 60
        while not _totals(dump):
            if time.monotonic() > deadline:
                raise SystemExit(f"callgrind wrote no counts to {dump}")
            time.sleep(0.1)
        return _totals(dump) / calls


def _totals(dump: Path) -> int:
    try:
        text = dump.read_text()
    except OSError:
        return 0
    # "totals:" is the dump's count; its "summary:" line is not (it reads 0 after a zeroing dump).
    for line in text.splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    return 0


def post(port: int, path: str, body: bytes, ctype: str, calls: int, token: str = TOKEN) -> None:
    """``calls`` POSTs one at a time on one connection; any answer but 200 ends the run."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    headers = {"Content-Type": ctype, "Authorization": token} if token else {"Content-Type": ctype}
    try:
        for _ in range(calls):
            conn.request("POST", path, body, headers)
            answer = conn.getresponse()
            data = answer.read()
            if answer.status != 200:
                raise SystemExit(f"POST {path}: {answer.status} {data[:300]!r}")
    finally:
        conn.close()


# The library's loop: LOADER sets ``predict``; counting is switched on between "ready" and
# "done" by the parent, which answers each line on stdin.
_LOOP = r"""
import sys, numpy as np
runtime, path, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
x = np.load(sys.argv[4])
{loader}
for _ in range({warm}):
    predict(x)
print("ready", flush=True); sys.stdin.readline()
for _ in range(calls):
    predict(x)
print("done", flush=True); sys.stdin.readline()
"""


def library(runtime: str, path: Path, x_file: Path, calls: int, work: Path) -> float:
    out = work / f"library-{runtime}.cg"
    code = _LOOP.format(loader=LOADER, warm=WARM_UP)
    argv = [*callgrind(out), PY, "-c", code, runtime, str(path), str(calls), str(x_file)]
    env = dict(gateway_env(), PYTHONHASHSEED="0")
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, env=env, cwd=ROOT) as child:  # fmt: skip
        assert child.stdin is not None and child.stdout is not None
        counter = Counter(child.pid, out)
        if child.stdout.readline().strip() != "ready":
            raise SystemExit(f"{runtime}: the library's loop did not start")

        def run() -> None:
            child.stdin.write("go\n")  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
            if child.stdout.readline().strip() != "done":  # type: ignore[union-attr]
                raise SystemExit(f"{runtime}: the library's loop failed")

        per_call = counter.count(run, calls)
        child.stdin.close()
        child.wait(timeout=120)
    return per_call


def start(argv: list[str], port_file: Path | None, port: int, ready: list[str]) -> tuple[Child, int]:
    """A server under callgrind; returns once each of ``ready`` answers 200 (a minute or two)."""
    child = Child(argv, env=dict(gateway_env(), PYTHONHASHSEED="0", PYTHONPATH=str(ROOT)))
    deadline = time.monotonic() + 600
    while True:
        if child.proc.poll() is not None or time.monotonic() > deadline:
            out = child.output()
            child.stop()
            raise SystemExit(f"{argv[-1]} did not start under callgrind:\n{out[-3000:]}")
        if port_file is not None and port == 0:
            text = port_file.read_text().strip() if port_file.exists() else ""
            port = int(text.rsplit(":", 1)[-1]) if text else 0
        if port and _listens(port) and all(_answers(port, path) for path in ready):
            return child, port
        time.sleep(0.5)


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
        return True
    except OSError:
        return False


def _answers(port: int, path: str) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", path, headers={"Authorization": TOKEN})
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def gateway_config(work: Path, models: dict[tuple[str, str], Path]) -> Path:
    services = "".join(
        f"  - name: {rt}\n    token: {TOKEN}\n    processor: {rt}\n    model: {path}\n"
        f"    workers: 1\n    placement: thread\n"
        for (rt, _), path in models.items()
    )
    cfg = work / "services.yaml"
    cfg.write_text(
        "gateway:\n  host: 127.0.0.1\n  port: 0\n  access_log: false\n"
        f"  data_dir: {work / 'data'}\n  model_dirs: [{work / 'models'}]\nservices:\n{services}"
    )
    return cfg


Row = tuple[str, str]  # (runtime or "floor", protocol)


def one_round(work: Path, models: dict[tuple[str, str], Path], calls: int) -> dict[Row, float]:
    counts: dict[Row, float] = {}
    for (rt, size), path in models.items():
        x_file = work / f"{rt}.npy"
        np.save(x_file, rows_of(rt, size))
        counts[(rt, "library")] = library(rt, path, x_file, calls, work)
        print(f"  {rt:<9} library  {counts[(rt, 'library')] / 1e3:>8.1f}k instructions a call", flush=True)
    cfg = gateway_config(work, models)
    port_file = work / "port"
    port_file.unlink(missing_ok=True)
    out = work / "gateway.cg"
    argv = [*callgrind(out), PY, "-m", "gateway", "serve", "--config", str(cfg), "--port", "0",
            "--port-file", str(port_file)]  # fmt: skip
    gw, port = start(argv, port_file, 0, [f"/v2/models/{rt}/ready" for rt, _ in models])
    try:
        counter = Counter(gw.pid, out)
        for rt, _ in models:
            files = bodies(work, rt, rows_of(rt, SIZE))
            for protocol, url, body, ctype in (
                ("V2 JSON", f"/v2/models/{rt}/infer", files["json"], "application/json"),
                ("EAS TF", f"/api/predict/{rt}", files["tf"], "application/octet-stream"),
            ):
                data = body.read_bytes()
                post(port, url, data, ctype, WARM_UP)
                count = functools.partial(post, port, url, data, ctype, calls)
                counts[(rt, protocol)] = gw_count = counter.count(count, calls)
                own = gw_count - counts[(rt, "library")]
                print(f"  {rt:<9} {protocol:<8} {gw_count / 1e3:>8.1f}k, own {own / 1e3:>7.1f}k", flush=True)
    finally:
        gw.stop()
    port = free_port()
    out = work / "floor.cg"
    argv = [*callgrind(out), PY, str(ROOT / "benchmarks" / "front_floor_server.py"), str(port)]
    floor, _ = start(argv, None, port, [])
    try:
        body = v2_body(work / "floor.json", "input", "predict", rows_of("lightgbm", SIZE)).read_bytes()
        post(port, FLOOR_PATH, body, "application/json", WARM_UP, token="")
        counts[("floor", "V2 JSON")] = Counter(floor.pid, out).count(
            lambda: post(port, FLOOR_PATH, body, "application/json", calls, token=""), calls
        )
        print(f"  floor     V2 JSON  {counts[('floor', 'V2 JSON')] / 1e3:>8.1f}k", flush=True)
    finally:
        floor.stop()
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    round_options(ap, rounds=2, connections=None)  # --seconds: accepted, not used (calls are counted)
    ap.add_argument("--calls", type=int, default=300, help="calls counted per figure (one at a time)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.calls = 1, 50
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        raise SystemExit("valgrind is not installed: apt-get install valgrind (scripts/bench.sh does)")
    work = Path(tempfile.mkdtemp(prefix="easkit-bench-instructions-"))
    models = build(work / "models", sizes=(SIZE,))
    rounds: list[dict[Row, float]] = []
    for rnd in range(1, args.rounds + 1):
        print(f"round {rnd}: {args.calls} calls a figure", flush=True)
        rounds.append(one_round(work, models, args.calls))
    report(rounds, args)


def report(rounds: list[dict[Row, float]], args: argparse.Namespace) -> None:
    def med(row: Row) -> float:
        return median([r[row] for r in rounds])

    def spread(row: Row) -> float:
        values = [r[row] for r in rounds]
        return (max(values) - min(values)) / med(row) if med(row) else 0.0

    floor = med(("floor", "V2 JSON"))
    print(f"\ninstructions a call, thousands (median of {len(rounds)} rounds; spread = (max - min) / median)")
    print(
        f"{'runtime':<10}{'protocol':<10}{'library':>9}{'gateway':>9}{'own':>8}{'own/floor':>10}{'spread':>8}"
    )
    rows = []
    targets: list[Target] = []
    for rt in RUNTIMES:
        lib = med((rt, "library"))
        for protocol in ("V2 JSON", "EAS TF"):
            gw = med((rt, protocol))
            own = gw - lib
            figures = f"{lib / 1e3:>9.1f}{gw / 1e3:>9.1f}{own / 1e3:>8.1f}{own / floor:>10.2f}"
            print(f"{rt:<10}{protocol:<10}{figures}{spread((rt, protocol)):>8.1%}")
            rows.append({"runtime": rt, "protocol": protocol, "library": lib, "gateway": gw, "own": own})
            targets.append(Target(f"{rt} {protocol}: own instructions a call", own / 1e3, "", None, "k"))
    floor_spread = spread(("floor", "V2 JSON"))
    print(f"{'floor':<10}{'V2 JSON':<10}{'':>9}{floor / 1e3:>9.1f}{'':>8}{1:>10.2f}{floor_spread:>8.1%}")
    rows.append({"runtime": "floor", "protocol": "V2 JSON", "gateway": floor})
    targets.append(Target("floor: the lean front alone, instructions a call", floor / 1e3, "", None, "k"))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    doc = {"rounds": len(rounds), "calls": args.calls, "rows": rows}
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    report_targets("bench_instructions", targets)


if __name__ == "__main__":
    main()
