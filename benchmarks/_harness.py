"""Shared pieces of the benchmarks: wrk runs, CPU accounting, pinning, child processes.

Method (see docs/benchmarks.md): servers run pinned to core 0, the load generator
to core 1; targets are measured in interleaved rounds and every ratio is taken
within a round, then the median over rounds is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TOKEN = "bench-token-0123456789"  # every benchmark's services take this token
CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1


def pin(core: int) -> list[str]:
    """argv prefix pinning a process (and its children) to one core, when possible."""
    if shutil.which("taskset") and NCPU > core:
        return ["taskset", "-c", str(core)]
    return []


def round_options(
    ap: argparse.ArgumentParser,
    *,
    rounds: int = 3,
    seconds: float = 4.0,
    connections: int | None = 16,
    quick_seconds: float = 2.0,
) -> None:
    """``--rounds``, ``--seconds``, ``--connections`` (unless ``connections`` is None: a benchmark
    that sets its own) and ``--quick`` (see :func:`quick_rounds`)."""
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--seconds", type=float, default=seconds)
    if connections is not None:
        ap.add_argument("--connections", type=int, default=connections)
    ap.add_argument("--quick", action="store_true", help=f"1 round x {quick_seconds:g} s (smoke run)")
    ap.set_defaults(quick_seconds=quick_seconds)


def quick_rounds(args: argparse.Namespace) -> argparse.Namespace:
    """``--quick``: one round of ``quick_seconds`` (2 s unless :func:`round_options` was told)."""
    if args.quick:
        args.rounds, args.seconds = 1, args.quick_seconds
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def tree_pids(pid: int) -> list[int]:
    out = [pid]
    try:
        import psutil

        out += [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: S110 - accounting is best effort
        pass
    return out


def cpu_seconds(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15)
    return total / CLK_TCK


@dataclass
class WrkResult:
    rps: float
    requests: int
    p50_us: float
    p99_us: float
    non2xx: int
    errors: int
    cpu_us_per_req: float


_LUA = """
local f = io.open(os.getenv("BENCH_BODY"), "rb")
wrk.method = "POST"
wrk.body = f:read("*all")
f:close()
wrk.headers["Content-Type"] = os.getenv("BENCH_CTYPE") or "application/octet-stream"
local tok = os.getenv("BENCH_TOKEN")
if tok and tok ~= "" then wrk.headers["Authorization"] = tok end
for k, v in string.gmatch(os.getenv("BENCH_HEADERS") or "", "([^:\\n]+): ([^\\n]*)") do
  wrk.headers[k] = v
end
"""


def _to_us(value: str, unit: str) -> float:
    return float(value) * {"us": 1.0, "ms": 1000.0, "s": 1_000_000.0}[unit]


def run_wrk(
    url: str,
    body: Path,
    *,
    connections: int,
    seconds: float,
    token: str = "",
    server_pids: Sequence[int] = (),
    content_type: str = "application/octet-stream",
    headers: dict[str, str] | None = None,
    core: int = 1,
) -> WrkResult:
    lua = Path(tempfile.gettempdir()) / "easkit_bench_post.lua"
    lua.write_text(_LUA)
    env = dict(
        os.environ,
        BENCH_BODY=str(body),
        BENCH_TOKEN=token,
        BENCH_CTYPE=content_type,
        BENCH_HEADERS="\n".join(f"{k}: {v}" for k, v in (headers or {}).items()),
    )
    cmd = [
        *pin(core),
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--latency",
        "-s",
        str(lua),
        url,
    ]
    cpu0 = cpu_seconds(server_pids)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    cpu1 = cpu_seconds(server_pids)
    reqs = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    lat = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M))

    def parse(v: str) -> float:
        m = re.match(r"([\d.]+)(us|ms|s)", v)
        return _to_us(m.group(1), m.group(2)) if m else float("nan")

    non2xx = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0
    errs = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = sum(int(x) for x in errs.groups()) if errs else 0
    cpu_us = (cpu1 - cpu0) * 1e6 / reqs if reqs else float("nan")
    return WrkResult(
        rps, reqs, parse(lat.get("50", "nan")), parse(lat.get("99", "nan")), non2xx, errors, cpu_us
    )


class Child:
    """A child process in its own session, killed with its whole group on exit."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path = ROOT) -> None:
        # Output goes to a file, not a pipe nobody reads while measuring: a chatty child
        # (an access log) would block once the pipe's buffer is full.
        self.log = tempfile.TemporaryFile(mode="w+", prefix="easkit-bench-child-")
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
        )

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop_group(self.proc)
        self.log.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_gateway(config: Path, env: dict[str, str], *, core: int = 0) -> tuple[Child, str]:
    """``python -m gateway serve --config CONFIG`` pinned to ``core`` on a free port; returns once
    it listens: (the child, its ``host:port``). A gateway that does not start ends the run."""
    port_file = config.parent / "port"
    port_file.unlink(missing_ok=True)
    argv = [*pin(core), PY, "-m", "gateway", "serve", "--config", str(config), "--port", "0",
            "--port-file", str(port_file)]  # fmt: skip
    gateway = Child(argv, env=env)
    deadline = time.monotonic() + 120
    while not port_file.exists() or not port_file.read_text().strip():
        if gateway.proc.poll() is not None or time.monotonic() > deadline:
            out = gateway.output()
            gateway.stop()
            raise SystemExit(f"gateway did not start:\n{out[-3000:]}")
        time.sleep(0.1)
    return gateway, port_file.read_text().strip()


def serve(
    folder: Path,
    gateway: dict[str, Any],
    services: list[dict[str, Any]],
    env: dict[str, str],
    *,
    core: int = 0,
) -> tuple[Child, str]:
    """A gateway with ``gateway``'s settings and ``services``, its config written to
    ``FOLDER/services.yaml``, started by :func:`start_gateway`."""
    import yaml

    config = folder / "services.yaml"
    config.write_text(yaml.safe_dump({"gateway": gateway, "services": services}))
    return start_gateway(config, env, core=core)


def sample_model(name: str) -> Path:
    """``samples/models/NAME``; a run without it ends saying how to build it."""
    model = ROOT / "samples" / "models" / name
    if not model.exists():
        raise SystemExit(f"samples/models/{name} is missing: python samples/build_models.py")
    return model


def tf_predict_body(
    path: Path, x: np.ndarray, *, input_name: str = "input", signature_name: str = "serving_default"
) -> Path:
    """``x`` (float32) as the EAS TF PredictRequest a wrk run posts, written to ``path``."""
    from eas_sdk._proto import tf_predict_pb2 as tf

    req = tf.PredictRequest(signature_name=signature_name)
    arr = req.inputs[input_name]
    arr.dtype = tf.DT_FLOAT
    arr.array_shape.dim.extend(x.shape)
    arr.float_val.extend(x.ravel().tolist())
    path.write_bytes(req.SerializeToString())
    return path


def stop_group(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM the process group of ``proc`` (started with start_new_session), SIGKILL if stuck."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(5)


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def checked(label: str, r: WrkResult, *, socket_errors_ok: bool = False) -> WrkResult:
    """``r``, or the end of the run when a call failed: a figure over failed calls is not one."""
    if r.non2xx or (r.errors and not socket_errors_ok):
        raise SystemExit(f"{label}: {r.non2xx} non-2xx, {r.errors} socket errors")
    return r


def paired(base: Sequence[WrkResult], other: Sequence[WrkResult]) -> tuple[float, float]:
    """``other`` against ``base``, measured in the same rounds: the median of the per-round
    throughput ratios and of the per-round differences in server CPU per call (µs)."""
    pairs = list(zip(base, other, strict=True))
    ratio = median([o.rps / b.rps for b, o in pairs])
    extra = median([o.cpu_us_per_req - b.cpu_us_per_req for b, o in pairs])
    return ratio, extra


@dataclass
class Target:
    """One figure a benchmark holds itself to: ``figure`` compared with ``goal`` by ``op``."""

    scenario: str
    figure: float
    op: str  # ">=" or "<="; "" for a figure reported without a goal
    goal: float | None = None
    unit: str = ""

    @property
    def ok(self) -> bool:
        if self.goal is None or not self.op:
            return True
        return self.figure >= self.goal if self.op == ">=" else self.figure <= self.goal


RESULTS_ENV = "EASKIT_BENCH_RESULTS"  # scripts/bench.sh: where each benchmark writes its targets


def report_targets(bench: str, targets: Sequence[Target]) -> bool:
    """Print the targets in one shape, write them as JSON where scripts/bench.sh asks
    (``$EASKIT_BENCH_RESULTS/<bench>.json``, gathered by benchmarks/summary.py) and say
    whether every goal was met."""
    print(f"\n{bench}: targets")
    for t in targets:
        goal = f"{t.op} {t.goal:g}{t.unit}" if t.goal is not None else "-"
        verdict = "-" if t.goal is None else "pass" if t.ok else "MISS"
        print(f"  {t.scenario:<46}{t.figure:>10.2f}{t.unit:<3} goal {goal:<12}{verdict}")
    out = os.environ.get(RESULTS_ENV)
    if out:
        rows = [{**t.__dict__, "ok": t.ok} for t in targets]
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{bench}.json").write_text(json.dumps({"bench": bench, "targets": rows}))
    return all(t.ok for t in targets)
