"""A fault run: start the load generator, inject faults on a schedule, heal each one and wait
for the system to serve again, stop the load, let it drain, and check the history.

The schedule's own waits (how long a fault is held) are the test; everything else waits on
polled conditions with deadlines.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.checker import Fault, Report, check, dump, load_history
from tests.faults.cluster import ASYNC_SERVICE, QUEUE, SERVICE, TOKEN, Cluster, wait_for

# Every predict call begun this long after a heal must succeed, and every producer must
# have a put acknowledged again within it (the stated recovery bound).
RECOVERY_BOUND_S = 10.0


@dataclass
class Step:
    """One fault: ``inject`` then, ``hold_s`` later, ``heal``."""

    name: str
    inject: Callable[[Cluster], None]
    heal: Callable[[Cluster], None]
    hold_s: float
    documented_loss: bool = False
    # Hosts the fault leaves unable to answer at all (a paused gateway), set by ``inject``.
    silenced: list[str] = field(default_factory=list)
    # Statuses the fault documents beyond the usual ones (checker.Fault.allowed).
    allowed: list[int] = field(default_factory=list)
    # Done before the fault's start is taken (the state the fault should find).
    prepare: Callable[[Cluster], None] | None = None


def holder(cluster: Cluster, hosts: tuple[str, ...] = ("gw1", "gw2")) -> str | None:
    """The gateway serving the queue (its listing holds the queue's figures), if one does."""
    for host in hosts:
        if cluster.services(host).get(QUEUE, {}).get("queues"):
            return host
    return None


def wait_holder(cluster: Cluster, timeout: float = 20.0) -> str:
    found: list[str] = []

    def any_holder() -> bool:
        h = holder(cluster)
        if h:
            found.append(h)
        return bool(h)

    wait_for(any_holder, "a gateway serving the queue", timeout, every=0.3)
    return found[-1]


def consumer_pause(cluster: Cluster) -> Path:
    """While this file exists the load's group consumer reads nothing."""
    return cluster.workdir / "consumer.pause"


class LoadRun:
    def __init__(
        self,
        cluster: Cluster,
        put_via: list[str],
        watch_via: str,
        predict_via: list[str],
        async_via: str | None = None,
    ) -> None:
        self.cluster = cluster
        wd = cluster.workdir
        self.history = wd / "history.jsonl"
        self.stop = wd / "stop"
        self.history.unlink(missing_ok=True)
        self.stop.unlink(missing_ok=True)
        self.spec: dict[str, Any] = {
            "history": str(self.history),
            "stop": str(self.stop),
            "queue": QUEUE,
            "service": SERVICE,
            "token": TOKEN,
            "put_via": [cluster.url(h) for h in put_via],
            "watch_via": cluster.url(watch_via),
            "predict_via": [cluster.url(h) for h in predict_via],
            "async_via": cluster.url(async_via) if async_via else None,
            "async_service": ASYNC_SERVICE,
            "consumer_pause": str(consumer_pause(cluster)),
            "drain_s": 30,
        }
        spec_path = wd / "load.json"
        spec_path.write_text(json.dumps(self.spec), encoding="utf-8")
        self.proc = cluster.start(
            "load", "client", [sys.executable, "-m", "tests.faults.loadgen", str(spec_path)]
        )
        self._seen = 0
        self._events: list[dict[str, Any]] = []

    def events(self) -> list[dict[str, Any]]:
        """The history so far (complete lines only)."""
        if not self.history.exists():
            return []
        with self.history.open("rb") as f:
            f.seek(self._seen)
            chunk = f.read()
        cut = chunk.rfind(b"\n") + 1
        for line in chunk[:cut].splitlines():
            if line.strip():
                self._events.append(json.loads(line))
        self._seen += cut
        return self._events

    def flowing_since(self, t: float) -> bool:
        """Every producer has a put acknowledged, and the caller a predict answered, begun after ``t``."""
        evs = self.events()
        producers = {e["p"] for e in evs if e["f"] == "put"} or {"p0"}
        ok_puts = {e["p"] for e in evs if e["f"] == "put" and e["type"] == "ok" and e["t0"] >= t}
        callers = {"predict" if i == 0 else f"predict{i}" for i in range(len(self.spec["predict_via"]))}
        predict_ok = callers <= {
            e["p"] for e in evs if e["f"] == "predict" and e["type"] == "ok" and e["t0"] >= t
        }
        if not self.proc.alive():
            raise RuntimeError(f"the load generator exited:\n{self.proc.tail()}")
        return producers <= ok_puts and predict_ok

    def finish(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        self.stop.touch()
        try:
            self.proc.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(
                f"the load generator did not finish its drain:\n{self.proc.tail()}"
            ) from None
        self._events = []
        self._seen = 0
        return load_history(self.history)


def run_schedule(
    cluster: Cluster,
    steps: list[Step],
    put_via: list[str],
    watch_via: str,
    predict_via: str | list[str] | None,
    gap_s: float = 2.0,
    async_via: str | None = None,
) -> tuple[list[dict[str, Any]], list[Fault], Report]:
    callers = [predict_via] if isinstance(predict_via, str) else list(predict_via or [])
    load = LoadRun(cluster, put_via, watch_via, callers, async_via)
    faults: list[Fault] = []
    wait_for(lambda: load.flowing_since(0.0), "load flowing before the first fault", 30, every=0.2)
    time.sleep(gap_s)  # steady load before the first fault: part of the schedule
    for step in steps:
        if step.prepare is not None:
            step.prepare(cluster)
        start = time.monotonic()
        step.inject(cluster)
        time.sleep(step.hold_s)  # the fault's duration is the test
        step.heal(cluster)
        heal = time.monotonic()
        silenced = [cluster.url(h) for h in step.silenced]
        faults.append(
            Fault(step.name, start, heal, step.documented_loss, False, silenced, list(step.allowed))
        )
        # Served again: a bound the report states, not a timing assertion on the way there.
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda heal=heal: load.flowing_since(heal),  # type: ignore[misc]
                f"served again after {step.name}",
                RECOVERY_BOUND_S * 2,
                every=0.2,
            )
        time.sleep(gap_s)  # steady load between faults: part of the schedule
    events = load.finish()
    # The run as test data, should it fail: kept in tests/faults/data once its cause is fixed.
    dump(cluster.workdir / "run.json", events, faults, "")
    return events, faults, check(events, faults, RECOVERY_BOUND_S)


# ---------------------------------------------------------------------- fault steps
def partition_step(name: str, a: str | Callable[[Cluster], str], b: str, hold_s: float) -> Step:
    """Partition host ``a`` (or the host ``a(cluster)`` picks when injected) from ``b``."""
    chosen: list[str] = []

    def inject(c: Cluster) -> None:
        chosen[:] = [a(c) if callable(a) else a]
        c.net.partition(chosen[0], b)

    return Step(name, inject, lambda c: c.net.heal(), hold_s)


def lossy_step(name: str, a: str, b: str, percent: int, hold_s: float) -> Step:
    def inject(c: Cluster) -> None:
        c.net.lossy(a, b, percent)
        c.net.slow(a)

    return Step(name, inject, lambda c: c.net.heal(), hold_s)


def pause_step(name: str, hold_s: float) -> Step:
    """SIGSTOP the gateway serving the queue for ``hold_s`` (past its lease), then SIGCONT."""

    def inject(c: Cluster) -> None:
        step.silenced[:] = [wait_holder(c)]
        c.procs[step.silenced[0]].signal(signal.SIGSTOP)

    def heal(c: Cluster) -> None:
        c.procs[step.silenced[0]].signal(signal.SIGCONT)

    step = Step(name, inject, heal, hold_s)
    return step


def redis_restart_step(name: str, aof: bool, hold_s: float, backlog_s: float = 0.0) -> Step:
    """kill -9 of redis-server, restarted after ``hold_s`` on the same directory. With
    ``backlog_s`` the group consumer stops reading that long before the kill (and reads on
    after the restart), so the queue holds records the restart can lose."""

    def prepare(c: Cluster) -> None:
        consumer_pause(c).touch()
        time.sleep(backlog_s)  # the backlog's length is part of the schedule

    def inject(c: Cluster) -> None:
        c.procs["redis"].kill()

    def heal(c: Cluster) -> None:
        c.start_redis(aof=aof)
        consumer_pause(c).unlink(missing_ok=True)

    return Step(name, inject, heal, hold_s, documented_loss=not aof, prepare=prepare if backlog_s else None)


def clock_step(name: str, host: str | Callable[[Cluster], str], offset: str, hold_s: float) -> Step:
    """Step the wall clock of one gateway (started with ``clock=True``) by ``offset``, and
    back after ``hold_s`` (a step backwards, as an NTP correction of a clock that ran ahead).
    A step past the signature's Date window makes that gateway refuse signed calls with 401
    naming the skew (docs/security.md): documented for this fault, and only while it lasts."""
    chosen: list[str] = []

    def inject(c: Cluster) -> None:
        chosen[:] = [host(c) if callable(host) else host]
        c.step_clock(chosen[0], offset)

    def heal(c: Cluster) -> None:
        c.step_clock(chosen[0], "+0")

    days = offset.endswith("d") and abs(int(offset[:-1])) >= 1
    return Step(name, inject, heal, hold_s, allowed=[401] if days else [])


# ---------------------------------------------------------------------- a full disk
def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True, timeout=10
    )


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, timeout=10, capture_output=True)


def stale_mounts(marker: str = "/fzt") -> list[str]:
    """Mount points of suite runs whose process is gone (``.../fzt<pid>-disk``)."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1]
        tail = point.rsplit("/", 1)[-1]
        if marker in point and tail.startswith("fzt") and tail.endswith("-disk"):
            pid = tail[3:-5]
            if pid.isdigit() and (int(pid) == os.getpid() or not Path(f"/proc/{pid}").exists()):
                out.append(point)
    return out


def fill(path: Path) -> Path:
    """Fill the file system of ``path`` to the last byte; the filler, to delete on heal."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 1):  # big writes, then the last partial blocks
            block = b"\0" * size
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, block)
    finally:
        os.close(fd)
    return filler


def disk_full_step(name: str, disk: Path, hold_s: float) -> Step:
    def inject(c: Cluster) -> None:
        fill(disk)

    def heal(c: Cluster) -> None:
        (disk / "filler").unlink()

    return Step(name, inject, heal, hold_s)
