"""The gateway's own work per call, counted in CPU instructions instead of timed.

A latency on a shared 2-core VM moves by a third from one run to the next, and with it
every "added p50": too much to tell whether a change to the gateway's request path saved
a few microseconds. Instructions executed barely move with the machine. Here each program
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
    own work on the call (HTTP, token, route, admission, codec in and out, metrics). The
    gateway's bounds on how long a run in its event loop may take are scaled by callgrind's
    slowdown, so that a call takes the path it takes at native speed (see SLOWDOWN). Each
    request is written in one send, as wrk writes it for the timed benchmarks; LightGBM's
    V2 JSON call is also counted written as http.client and requests write it, the head and
    then the body, which the gateway then reads apart (``V2 JSON in two sends``);
  * ``floor``: the gateway's lean HTTP front alone (front_floor_server.py) answering each
    call at once: what any call through that front costs, in the ``own`` count too;
  * ``part``: the front's and the codecs' parts of LightGBM's call, each alone in one
    process: the request's head and body read, its V2 JSON decoded, the answer encoded, the
    answer written; the EAS TFRequest decoded (its format sniffed, as a service's processor
    does by default) and its answer encoded.

The client runs outside Valgrind and waits for each answer before the next call, so no
two calls overlap. What is left to vary moves a count little: the rounds of one run agree
to about half a per cent; on a busy machine a call lasts longer, the gateway's periodic
tasks (a status sample every second) fall more often within the calls counted, and a run
reads a few per cent higher. Compare counts taken in one run, or on a quiet machine.

Needs Valgrind (``apt-get install valgrind``; scripts/bench.sh installs it). Under
callgrind a program runs about fifty times slower: the gateway takes a minute or two to
start, and a round three to four minutes.

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
from _runtimes_common import gateway_env
from bench_runtimes import LOADER, RUNTIMES, bodies, build, rows_of

RESULTS = ROOT / "benchmarks" / "results" / "instructions.json"
WARM_UP = 50  # calls before counting: imports, caches and specialised bytecode settle
SIZE = "small"
FLOOR_PATH = "/api/predict/floor"
SPLIT = "V2 JSON in two sends"  # the row of a call whose head and body come apart
# Under callgrind a program runs some fifty times slower, and the gateway picks where a
# model runs by how long its runs take (gateway.worker.compute): at that pace no run is short
# enough for the event loop, and every call would take the hand-off to the compute thread
# and back, which at native speed it does not take (about 50 thousand instructions more). The
# gateway is started with those bounds scaled by the slowdown, so the path counted is the
# one a call takes at native speed.
SLOWDOWN = 100
_GATEWAY = (
    "import runpy\n"
    "import gateway.backends.threads as threads, gateway.worker.compute as compute\n"
    f"compute.SIZED_INLINE_S *= {SLOWDOWN}\n"
    f"compute.INLINE_BUDGET_S *= {SLOWDOWN}\n"
    f"threads.INLINE_MAX_S *= {SLOWDOWN}\n"
    "runpy.run_module('gateway', run_name='__main__', alter_sys=True)\n"
)


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


def post(
    port: int, path: str, body: bytes, ctype: str, calls: int, token: str = TOKEN, split: bool = False
) -> None:
    """``calls`` POSTs one at a time on one connection, each request written in one send, as
    wrk writes it for the timed benchmarks (``split``: its head and its body in two sends, as
    http.client writes them, so the gateway reads the head before the body is in); any answer
    but 200 ends the run."""
    auth = f"Authorization: {token}\r\n" if token else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\n{auth}\r\n"
    ).encode("latin-1")
    sends = [head, body] if split else [head + body]
    with socket.create_connection(("127.0.0.1", port), timeout=600) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        answers = sock.makefile("rb")
        for _ in range(calls):
            for data in sends:
                sock.sendall(data)
            status = answers.readline().split(b" ", 2)
            length = 0
            while (line := answers.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            answer = answers.read(length)
            if len(status) < 2 or status[1] != b"200":
                raise SystemExit(f"POST {path}: {b' '.join(status).strip()!r} {answer[:300]!r}")


# A child counted piece by piece: ``pieces`` maps each piece's label to a no-argument
# callable; after WARM_UP calls of a piece it says "ready <label>", waits for a line
# (counting is switched on meanwhile), makes ``calls`` calls, says "done" and waits again;
# after the last piece it says "end".
_RUN_PIECES = r"""
for label, piece in pieces.items():
    for _ in range({warm}):
        piece()
    print("ready", label, flush=True); sys.stdin.readline()
    for _ in range(calls):
        piece()
    print("done", flush=True); sys.stdin.readline()
print("end", flush=True)
"""

# The library's loop: LOADER sets ``predict``.
_LOOP = r"""
import sys, numpy as np
runtime, path, x, calls = sys.argv[1], sys.argv[2], np.load(sys.argv[3]), int(sys.argv[4])
{loader}
pieces = {{"library": lambda: predict(x)}}
"""

# The lean front's, the V2 JSON codec's and the EAS codec's parts of a call, each alone (no
# server): where the gateway's own count goes. The request as the benchmark's client sends
# it; the answer to it from a model with one output of 10 FP64 values (LightGBM's small
# model), under the gateway's default answer limit (64 MiB). The EAS TFRequest is decoded as
# a processor decodes a service's calls by default (its format sniffed from the body).
_PARTS = r"""
import sys, numpy as np
from eas_sdk.codecs import eas
from gateway.codecs import v2_infer
from gateway.lean_http.connection import Connection
from gateway.lean_http.wire import Reply, encode_reply
body, tf_body, calls = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read(), int(sys.argv[3])
request = (
    b"POST /v2/models/lightgbm/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: identity\r\n"
    b"Content-Length: %d\r\nContent-Type: application/json\r\nAuthorization: token\r\n\r\n" % len(body)
) + body
conn = Connection(1 << 26, lambda method, path, headers, length: True)
decoded = v2_infer.parse_request(body)
outputs = {"predict": np.linspace(0.0, 1.0, 10).reshape(1, 10)}
LIMIT, OUT = 64 << 20, ["predict"]
answer, _ = v2_infer.answer("lightgbm", "1", decoded, outputs, OUT, None, LIMIT)
reply = Reply(200, answer, "application/json", {"X-Request-Id": "0123456789abcdef0123456789abcdef"})
tf_request = eas.decode_request(tf_body)

def http_in():
    conn.receive(request)
    conn.next()

pieces = {
    "HTTP request in (head and body)": http_in,
    "V2 JSON request decoded": lambda: v2_infer.parse_request(body),
    "V2 JSON answer encoded": lambda: v2_infer.answer("lightgbm", "1", decoded, outputs, OUT, None, LIMIT),
    "HTTP answer out": lambda: encode_reply(reply, False),
    "EAS TFRequest decoded": lambda: eas.decode_request(tf_body),
    "EAS TF answer encoded": lambda: eas.encode_response(tf_request, ["predict"], [outputs["predict"]], [0]),
}
"""


def count_pieces(name: str, code: str, args: list[str], calls: int, work: Path) -> dict[str, float]:
    """Instructions per call of each piece ``code`` defines (see _RUN_PIECES), by label, in
    the order ``code`` lists them."""
    out = work / f"{name}.cg"
    argv = [*callgrind(out), PY, "-c", code + _RUN_PIECES.format(warm=WARM_UP), *args, str(calls)]
    env = dict(gateway_env(), PYTHONHASHSEED="0", PYTHONPATH=str(ROOT))
    counts: dict[str, float] = {}
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env, cwd=ROOT) as child:  # fmt: skip
        stdin, stdout = child.stdin, child.stdout
        assert stdin is not None and stdout is not None
        counter = Counter(child.pid, out)
        while (line := stdout.readline().strip()) != "end":
            if not line.startswith("ready "):
                raise SystemExit(f"{name}: a piece did not start:\n{child.communicate()[1][-3000:]}")
            label = line.removeprefix("ready ")

            def run() -> None:
                stdin.write("go\n")
                stdin.flush()
                if stdout.readline().strip() != "done":
                    raise SystemExit(f"{name}: {label} failed")  # noqa: B023 - called in this turn

            counts[label] = counter.count(run, calls)
            stdin.write("\n")
            stdin.flush()
        stdin.close()
        child.wait(timeout=120)
    return counts


def library(runtime: str, path: Path, x_file: Path, calls: int, work: Path) -> float:
    code = _LOOP.format(loader=LOADER)
    args = [runtime, str(path), str(x_file)]
    return count_pieces(f"library-{runtime}", code, args, calls, work)["library"]


def start(argv: list[str], port_file: Path | None, port: int, ready: list[str]) -> tuple[Child, int]:
    """A server under callgrind; returns once each of ``ready`` answers 200 (a minute or two)."""
    child = Child(argv, env=dict(gateway_env(), PYTHONHASHSEED="0", PYTHONPATH=str(ROOT)))
    deadline = time.monotonic() + 600
    while True:
        if child.proc.poll() is not None or time.monotonic() > deadline:
            out = child.output()
            child.stop()
            raise SystemExit(f"did not start under callgrind: {' '.join(argv)[-300:]}\n{out[-3000:]}")
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
    argv = [*callgrind(out), PY, "-c", _GATEWAY, "serve", "--config", str(cfg), "--port", "0",
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
        # The same call as most Python clients write it (http.client, requests): the head,
        # then the body, which the gateway reads apart (an early check of the head, a hold
        # on the body's bytes, a body timer).
        data, url = (work / "lightgbm.json").read_bytes(), "/v2/models/lightgbm/infer"
        post(port, url, data, "application/json", WARM_UP, split=True)
        count = functools.partial(post, port, url, data, "application/json", calls, split=True)
        counts[("lightgbm", SPLIT)] = counter.count(count, calls)
        print(f"  lightgbm  {SPLIT} {counts[('lightgbm', SPLIT)] / 1e3:>8.1f}k", flush=True)
    finally:
        gw.stop()
    port = free_port()
    out = work / "floor.cg"
    argv = [*callgrind(out), PY, str(ROOT / "benchmarks" / "front_floor_server.py"), str(port)]
    floor, _ = start(argv, None, port, [])
    lgb_body = work / "lightgbm.json"  # written by bodies() above: LightGBM's V2 JSON call
    try:
        body = lgb_body.read_bytes()
        post(port, FLOOR_PATH, body, "application/json", WARM_UP, token="")
        counts[("floor", "V2 JSON")] = Counter(floor.pid, out).count(
            lambda: post(port, FLOOR_PATH, body, "application/json", calls, token=""), calls
        )
        print(f"  floor     V2 JSON  {counts[('floor', 'V2 JSON')] / 1e3:>8.1f}k", flush=True)
    finally:
        floor.stop()
    parts = count_pieces("parts", _PARTS, [str(lgb_body), str(work / "lightgbm.tf")], calls, work)
    for label, per_call in parts.items():
        counts[("part", label)] = per_call
        print(f"  part      {label:<34}{per_call / 1e3:>8.1f}k", flush=True)
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
    split, whole = med(("lightgbm", SPLIT)), med(("lightgbm", "V2 JSON"))
    own_split = split - med(("lightgbm", "library"))
    extra = (split - whole) / 1e3
    print(f"lightgbm  {SPLIT}: {split / 1e3:.1f}k, own {own_split / 1e3:.1f}k, {extra:+.1f}k over one send")
    rows.append({"runtime": "lightgbm", "protocol": SPLIT, "gateway": split, "own": own_split})
    floor_spread = spread(("floor", "V2 JSON"))
    print(f"{'floor':<10}{'V2 JSON':<10}{'':>9}{floor / 1e3:>9.1f}{'':>8}{1:>10.2f}{floor_spread:>8.1%}")
    rows.append({"runtime": "floor", "protocol": "V2 JSON", "gateway": floor})
    targets.append(Target("floor: the lean front alone, instructions a call", floor / 1e3, "", None, "k"))
    own = {p: med(("lightgbm", p)) - med(("lightgbm", "library")) for p in ("V2 JSON", "EAS TF")}
    print(
        f"\nparts of the gateway's own count on LightGBM's call ({own['V2 JSON'] / 1e3:.1f}k over V2 JSON, "
        f"{own['EAS TF'] / 1e3:.1f}k over the EAS TFRequest), counted alone"
    )
    for label in [label for kind, label in rounds[0] if kind == "part"]:
        part = med(("part", label))
        whole = own["EAS TF" if label.startswith("EAS TF") else "V2 JSON"]
        print(f"  {label:<36}{part / 1e3:>8.1f}k {part / whole:>6.1%}{spread(('part', label)):>8.1%}")
        rows.append({"runtime": "part", "protocol": label, "gateway": part})
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    doc = {"rounds": len(rounds), "calls": args.calls, "rows": rows}
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    report_targets("bench_instructions", targets)


if __name__ == "__main__":
    main()
