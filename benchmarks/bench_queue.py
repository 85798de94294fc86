"""Our queue service against Redis Streams, side by side.

Both servers run pinned to core 0 (``taskset -c 0``), this client process pins itself
to core 1; 1 KB payloads; rounds interleave Redis and ours and each ratio is the
median of the per-round ratios. Installs redis-server from the OS packages when it is
missing, starts it on a free port (``--save "" --appendonly no``) and stops it by pid.

Scenarios:
  cycle    one record at a time: put -> get -> commit (ours: 3 HTTP calls with the SDK;
           also put -> get(auto_delete), EAS's read-and-acknowledge in one call)
           vs XADD -> XREADGROUP COUNT 1 -> XACK (redis-py).
  stream   records already queued are pushed to one watcher (window 1024), which
           commits 100 indexes per commit call, vs XREADGROUP COUNT 100 + one XACK.
           Every delivered index/request id is checked: none lost, none duplicated,
           and the queue is empty at the end.

A third contestant runs the cycles for reference (no goal): the HTTP floor
(benchmarks/queue_floor_server.py), the same SDK calls against our lean HTTP front
around a Python dict, with no storage and no checks: what the protocol's exchange costs
by itself.

Usage: python benchmarks/bench_queue.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import Target, report_targets  # noqa: E402
from eas_sdk.queue import AsyncQueueClient, QueueClient  # noqa: E402

PAYLOAD = os.urandom(512).hex().encode()  # 1,024 bytes
SERVER_CORE = "0"
CLIENT_CORE = 1
WINDOW = 1024
COMMIT_EVERY = 100
TOKEN = os.environ.get("BENCH_TOKEN", "bench-token")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pinned(cmd: list[str]) -> list[str]:
    return (["taskset", "-c", SERVER_CORE] if shutil.which("taskset") else []) + cmd


def ensure_redis() -> str:
    path = shutil.which("redis-server")
    if path:
        return path
    print("redis-server missing: installing it with apt-get (Debian package redis-server)", flush=True)
    subprocess.run(["apt-get", "install", "-y", "redis-server"], check=True, capture_output=True)
    path = shutil.which("redis-server")
    if not path:
        raise SystemExit("redis-server could not be installed")
    return path


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"server on port {port} did not come up")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


# ----------------------------------------------------------------------------- servers


class Redis:
    def __init__(self) -> None:
        import redis

        self.port = free_port()
        cmd = [
            ensure_redis(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        self.proc = subprocess.Popen(pinned(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.proc)
        self.r = redis.Redis(host="127.0.0.1", port=self.port)
        self.version = self.r.info()["redis_version"]
        self.n = 0

    def fresh(self) -> str:
        self.n += 1
        key = f"q{self.n}"
        self.r.xgroup_create(key, "g", id="0", mkstream=True)
        return key

    def cycle(self, n: int) -> float:
        r, key = self.r, self.fresh()
        t = time.perf_counter()
        for _ in range(n):
            r.xadd(key, {"data": PAYLOAD})
            got = r.xreadgroup("g", "c", {key: ">"}, count=1)
            r.xack(key, "g", got[0][1][0][0])
        dt = time.perf_counter() - t
        assert r.xlen(key) == n and r.xpending(key, "g")["pending"] == 0
        return n / dt

    def stream(self, n: int) -> tuple[float, float]:
        r, key = self.r, self.fresh()
        for i in range(0, n, 100):
            p = r.pipeline(transaction=False)
            for _ in range(min(100, n - i)):
                p.xadd(key, {"data": PAYLOAD})
            p.execute()
        seen: set[bytes] = set()
        c0 = cpu_seconds(self.proc.pid)
        t = time.perf_counter()
        while len(seen) < n:
            got = r.xreadgroup("g", "c", {key: ">"}, count=100)
            ids = [entry_id for entry_id, _ in got[0][1]]
            seen.update(ids)
            r.xack(key, "g", *ids)
        dt = time.perf_counter() - t
        cpu = cpu_seconds(self.proc.pid) - c0
        assert len(seen) == n and r.xpending(key, "g")["pending"] == 0
        return n / dt, cpu / n * 1e6

    def close(self) -> None:
        self.r.close()
        stop(self.proc)


class Ours:
    def __init__(self, tmp: str, via: str = "queue-server", backend: str = "sqlite") -> None:
        self.port = free_port()
        cfg = Path(tmp) / "queue.yaml"
        cfg.write_text(
            f"gateway: {{host: 127.0.0.1, port: {self.port}, data_dir: {Path(tmp) / 'data'}, "
            "access_log: false, log_level: WARNING}\n"
            f"queue: {{backend: '{backend}'}}\n"
            "services:\n"
            + "".join(
                f"  - {{name: q{i}, processor: queue, token: {TOKEN}, queue: {{max_length: 1000000}}}}\n"
                for i in range(1, 200)
            )
        )
        if via == "gateway":  # the full gateway process (its middleware, routing and auth)
            cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(cfg)]
        else:  # the queue-only server: the same QueueManager behind a minimal route
            cmd = [sys.executable, "-m", "gateway.queue.server", "--uvloop", "--config", str(cfg)]
            if via == "queue-server-aiohttp":  # without its lean HTTP/1.1 front (fast.py)
                cmd.append("--no-fast-path")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        # cwd: "python -m" puts the working directory first on sys.path, ahead of PYTHONPATH,
        # so the server would import whatever tree the benchmark was started from.
        self.proc = subprocess.Popen(pinned(cmd), stdout=subprocess.DEVNULL, env=env, cwd=ROOT)
        wait_port(self.port, self.proc)
        self.n = 0
        self.endpoint = f"127.0.0.1:{self.port}"

    def client(self, name: str) -> QueueClient:
        c = QueueClient(self.endpoint, name)
        c.set_token(TOKEN)
        c.init()
        return c

    def fresh(self) -> str:
        self.n += 1
        return f"q{self.n}"

    def cycle(self, n: int, auto_delete: bool) -> float:
        q = self.client(self.fresh())
        t = time.perf_counter()
        for _ in range(n):
            idx, _ = q.put(PAYLOAD)
            if auto_delete:
                got = q.get(index=idx, timeout="0s")
            else:
                got = q.get(index=idx, timeout="0s", auto_delete=False)
                q.commit(got[0].index)
        dt = time.perf_counter() - t
        assert q.attributes()["stream.length"] == "0"
        return n / dt

    def fill(self, name: str, n: int) -> set[str]:
        async def run() -> set[str]:
            ids: set[str] = set()
            async with AsyncQueueClient(self.endpoint, name) as a:
                a.set_token(TOKEN)
                a.init()
                for i in range(0, n, 200):
                    res = await asyncio.gather(*(a.put(PAYLOAD) for _ in range(min(200, n - i))))
                    ids.update(rid for _, rid in res)
            return ids

        return asyncio.run(run())

    def stream(self, n: int) -> tuple[float, float]:
        name = self.fresh()
        put_ids = self.fill(name, n)
        assert len(put_ids) == n
        q = self.client(name)
        seen: set[str] = set()
        dup = 0
        batch: list[int] = []
        c0 = cpu_seconds(self.proc.pid)
        t = time.perf_counter()
        watcher = q.watch(0, WINDOW)
        for df in watcher.run():
            rid = df.tags["requestId"]
            if rid in seen:
                dup += 1
            seen.add(rid)
            batch.append(df.index)
            if len(batch) >= COMMIT_EVERY or len(seen) == n:
                q.commit(batch)
                batch = []
            if len(seen) == n:
                break
        dt = time.perf_counter() - t
        cpu = cpu_seconds(self.proc.pid) - c0
        watcher.close()
        length = q.attributes()["stream.length"]
        assert dup == 0, f"{dup} duplicate deliveries"
        assert seen == put_ids, f"lost {len(put_ids - seen)} records"
        assert length == "0", f"stream.length {length} after committing everything"
        q.close()
        return n / dt, cpu / n * 1e6

    def close(self) -> None:
        stop(self.proc)


class Floor(Ours):
    """The SDK's calls against benchmarks/queue_floor_server.py (a dict behind our HTTP front)."""

    def __init__(self) -> None:  # nothing of Ours' set-up applies
        self.port = free_port()
        cmd = [sys.executable, str(ROOT / "benchmarks" / "queue_floor_server.py"), str(self.port)]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(pinned(cmd), stdout=subprocess.DEVNULL, env=env, cwd=ROOT)
        wait_port(self.port, self.proc)
        self.n = 0
        self.endpoint = f"127.0.0.1:{self.port}"


# ----------------------------------------------------------------------------- main


def _interleaved(fns: dict[str, Any], n: int, slices: int) -> dict[str, tuple[float, float]]:
    """Run every fn(n / slices) in turn, ``slices`` times; per fn: (rate, server CPU us/record)."""
    m = max(1, n // slices)
    spent = dict.fromkeys(fns, 0.0)
    cpu = dict.fromkeys(fns, 0.0)
    for _ in range(slices):
        for name, fn in fns.items():
            out = fn(m)
            rate, per = (out, 0.0) if isinstance(out, float) else out
            spent[name] += m / rate
            cpu[name] += per * m
    return {name: (m * slices / spent[name], cpu[name] / (m * slices)) for name in fns}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run (< 30 s)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument(
        "--via",
        choices=("queue-server", "queue-server-aiohttp", "gateway"),
        default="queue-server",
        help="the queue-only server (gateway.queue.server), the same with aiohttp serving every call "
        "(--no-fast-path), or the full gateway (gateway serve)",
    )
    ap.add_argument(
        "--backend",
        choices=("sqlite", "redis"),
        default="sqlite",
        help="where our queues live: the embedded store, or the same redis-server the contestant uses "
        "(queue.backend: redis://...)",
    )
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    slices = 2 if args.quick else 4
    n_cycle = 300 if args.quick else 3000
    n_stream = 5000 if args.quick else 40_000
    try:
        os.sched_setaffinity(0, {CLIENT_CORE})
    except (AttributeError, OSError):
        print("warning: could not pin the client to core 1")
    tmp = tempfile.mkdtemp(prefix="bench-queue-")
    redis_srv = Redis()
    backend = f"redis://127.0.0.1:{redis_srv.port}/1" if args.backend == "redis" else "sqlite"
    ours = Ours(tmp, args.via, backend)
    floor = Floor()
    res: dict[str, list[float]] = {
        k: []
        for k in (
            "redis_cycle",
            "ours_cycle3",
            "ours_cycle2",
            "floor_cycle3",
            "floor_cycle2",
            "redis_stream",
            "ours_stream",
            "redis_stream_cpu",
            "ours_stream_cpu",
        )
    }
    ratios: dict[str, list[float]] = {"cycle3": [], "cycle2": [], "stream": [], "floor3": [], "floor2": []}
    try:
        # Warm-up (connections, code paths).
        redis_srv.cycle(50)
        ours.cycle(50, False)
        floor.cycle(50, False)
        total_checked = 0
        for rnd in range(rounds):
            # Each round alternates short slices of every contestant, so a burst of load from
            # elsewhere on the machine hits all of them alike; a rate = records / summed time.
            cyc = _interleaved(
                {
                    "redis": redis_srv.cycle,
                    "ours3": lambda m: ours.cycle(m, False),
                    "ours2": lambda m: ours.cycle(m, True),
                    "floor3": lambda m: floor.cycle(m, False),
                    "floor2": lambda m: floor.cycle(m, True),
                },
                n_cycle,
                slices,
            )
            rc, oc3, oc2 = cyc["redis"][0], cyc["ours3"][0], cyc["ours2"][0]
            fc3, fc2 = cyc["floor3"][0], cyc["floor2"][0]
            st = _interleaved({"redis": redis_srv.stream, "ours": ours.stream}, n_stream, slices)
            (rs, rs_cpu), (os_, os_cpu) = st["redis"], st["ours"]
            total_checked += n_stream
            for k, v in (
                ("redis_cycle", rc),
                ("ours_cycle3", oc3),
                ("ours_cycle2", oc2),
                ("floor_cycle3", fc3),
                ("floor_cycle2", fc2),
                ("redis_stream", rs),
                ("ours_stream", os_),
                ("redis_stream_cpu", rs_cpu),
                ("ours_stream_cpu", os_cpu),
            ):
                res[k].append(v)
            ratios["cycle3"].append(oc3 / rc)
            ratios["cycle2"].append(oc2 / rc)
            ratios["stream"].append(os_ / rs)
            ratios["floor3"].append(fc3 / rc)
            ratios["floor2"].append(fc2 / rc)
            print(
                f"round {rnd + 1}: cycle redis {rc:,.0f}/s ours {oc3:,.0f}/s (3 calls) "
                f"{oc2:,.0f}/s (2 calls); stream redis {rs:,.0f}/s ours {os_:,.0f}/s",
                flush=True,
            )
    finally:
        ours.close()
        floor.close()
        redis_srv.close()
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in res.items()}
    rat = {k: statistics.median(v) for k, v in ratios.items()}
    print()
    print(
        f"Queue vs Redis {redis_srv.version} (redis-py), 1 KB payloads, "
        f"servers on core 0, client on core 1; ours via {args.via}, queues in {args.backend}"
    )
    print(
        f"rounds: {rounds}; cycle N={n_cycle}; stream N={n_stream}, "
        f"window {WINDOW}, {COMMIT_EVERY} indexes/commit"
    )
    print(
        f"each round interleaves {slices} slices of every contestant; ratios are medians of per-round ratios"
    )
    print(f"{'metric':52s} {'redis':>10s} {'ours':>10s} {'ratio':>7s} target")
    rows: list[tuple[str, float, float, float, Any]] = [
        (
            "cycle put->get->commit (3 calls), ops/s",
            med["redis_cycle"],
            med["ours_cycle3"],
            rat["cycle3"],
            0.5,
        ),
        (
            "cycle put->get(auto_delete) (2 calls), ops/s",
            med["redis_cycle"],
            med["ours_cycle2"],
            rat["cycle2"],
            0.5,
        ),
        (
            "stream to watcher + batched commit, msgs/s",
            med["redis_stream"],
            med["ours_stream"],
            rat["stream"],
            0.5,
        ),
    ]
    for name, r, o, ratio, target in rows:
        verdict = "ok" if ratio >= target else "below"
        print(f"{name:52s} {r:10,.0f} {o:10,.0f} {ratio:7.2f} >= {target} {verdict}")
    floors = [
        ("HTTP floor: put->get->commit (3 calls), ops/s", med["floor_cycle3"], rat["floor3"]),
        ("HTTP floor: put->get(auto_delete) (2 calls), ops/s", med["floor_cycle2"], rat["floor2"]),
    ]
    for name, f, ratio in floors:
        print(f"{name:52s} {med['redis_cycle']:10,.0f} {f:10,.0f} {ratio:7.2f} (no goal)")
    met = report_targets(
        "bench_queue",
        [
            *(
                Target(f"queue: {name.split(',')[0]} / redis", ratio, ">=", target, "x")
                for name, _, _, ratio, target in rows
            ),
            *(Target(f"queue: {name.split(',')[0]} / redis", r, "", None, "x") for name, _, r in floors),
        ],
    )
    print(f"{'stream server CPU us/msg':52s} {med['redis_stream_cpu']:10.1f} {med['ours_stream_cpu']:10.1f}")
    print(
        f"records checked for loss/duplicates over the stream runs: {total_checked:,} (0 lost, 0 duplicated)"
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
