"""Judges a soak run (load.py): growth of memory, file descriptors and tasks, and whether
every failed call is one an injected fault explains.

Growth: a least-squares line through each process's samples taken after the warm-up; its
slope (per minute) must stay under the bound. A worker killed by the schedule is judged over
its own life after a warm-up of its own, when that covers at least half the judged stretch; the ``digits``
worker is never killed, so there is always one worker judged over the whole run.

The gateway's memory has one part that grows with the load by design: the queue store
remembers the request ids of the last ``RECENT_LIMIT`` (100,000) records removed from each
queue, so a retried put is recognised after its record was consumed (docs/queue.md). That
costs about ``REMEMBERED_ID_BYTES`` each (``python -m tests.soak.remembered_ids`` measures
it: 33 MB over the first 100,000 removals of one queue, nothing after); the soak's queue
callers go at a couple of puts a second so it stays small. The gateway's RSS bound is
therefore raised by what the queues' remembered ids grew over the judged stretch (their removals
from the history, each queue up to the limit), and the report shows that allowance.

Failures: a failed call is explained when its service had a worker killed and the call
overlaps the window from the kill to the new worker being ready, plus ``grace_s``, and it
failed with a documented status (reliability.md D6: 503 no ready worker, 450 pending queue
full, 504/408 the deadline). A reload explains nothing: it adds or removes a service no
load calls, and docs/operations.md says no call is cut.

Queues: every acknowledged put on ``jobs`` is read at least once by the watcher (at-least-
once: a read beyond the first is counted, not a failure). Asynchronous inference: every
acknowledged input has exactly one result with its request id in the sink, and that result
is the one for that input (the echo's bytes, the digit's label); a result for no input, a
second result, or another input's result is a failure.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DOCUMENTED_STATUSES = frozenset({408, 450, 503, 504})
RECENT_LIMIT = 100_000  # gateway.queue.records.RECENT_LIMIT
REMEMBERED_ID_BYTES = 340  # a remembered removal's cost in the gateway (see remembered_ids.py)
# A killed worker's service, and the callers that reach it.
CALLERS = {"echo": ("eas",), "digits": ("v1", "v2", "paddle", "cluster_serving", "grpc")}
# Asynchronous services and the load names of their inputs.
ASYNC = {"aecho": "async_eas", "adigits": "async_cs"}


@dataclass(frozen=True)
class Bounds:
    warmup_s: float
    rss_mb_per_min: float
    fds_per_min: float
    tasks_per_min: float


@dataclass
class Series:
    role: str
    pid: int
    metric: str
    n: int
    span_s: float
    slope_per_min: float
    bound: float
    first: float
    last: float

    @property
    def ok(self) -> bool:
        return self.slope_per_min <= self.bound

    def line(self) -> str:
        verdict = "ok" if self.ok else "GROWS"
        return (
            f"{self.role:>8} pid {self.pid:<7} {self.metric:<6} {self.first:9.1f} -> {self.last:9.1f}  "
            f"slope {self.slope_per_min:+8.3f}/min (bound {self.bound}/min, {self.n} samples "
            f"over {self.span_s:.0f} s) {verdict}"
        )


def slope_per_min(ts: Sequence[float], vs: Sequence[float]) -> float:
    """The least-squares slope of ``vs`` over ``ts`` (seconds), per minute."""
    if len(ts) < 3 or max(ts) - min(ts) <= 0:
        return 0.0
    return float(np.polyfit(np.asarray(ts) - ts[0], np.asarray(vs, float), 1)[0]) * 60.0


def removals(events: Iterable[Mapping[str, Any]]) -> dict[str, list[float]]:
    """When records left each queue, by queue: the plain queue's records as its watcher
    commits them, an asynchronous service's inputs and its sink's results as the results
    are read (the input was committed before its result could be read)."""
    out: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.get("f") == "read":
            names = ["jobs"] if e["p"] == "queue" else [f"{e['p']}-input", f"{e['p']}-sink"]
            for name in names:
                out[name].append(e["t"])
    return out


def remembered_mb_per_min(removed: Mapping[str, list[float]], t0: float, t1: float) -> float:
    """The growth of the queues' remembered ids between ``t0`` and ``t1``, in MB per minute."""
    grown = 0
    for times in removed.values():
        before = sum(1 for t in times if t < t0)
        until = sum(1 for t in times if t < t1)
        grown += min(until, RECENT_LIMIT) - min(before, RECENT_LIMIT)
    return grown * REMEMBERED_ID_BYTES / 2**20 / max((t1 - t0) / 60, 1e-9)


def growth(
    samples: Iterable[Any],
    t_start: float,
    t_end: float,
    bounds: Bounds,
    removed: Mapping[str, list[float]] | None = None,
) -> list[Series]:
    after = t_start + bounds.warmup_s
    judged = t_end - after
    by_pid: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for s in samples:
        by_pid[(s.role, s.pid)].append(s)
    out = []
    for (role, pid), every in sorted(by_pid.items()):
        # A process started during the run (a worker the schedule replaced, a service a
        # reload added) gets its own warm-up: its imports and first calls are not growth.
        since = max(after, every[0].t + bounds.warmup_s)
        got = [s for s in every if s.t >= since]
        if not got:
            continue
        span = got[-1].t - got[0].t
        if len(got) < 5 or span < judged / 2:
            continue  # a worker the schedule killed or started part-way: too short a life
        ts = [s.t for s in got]
        rss_bound = bounds.rss_mb_per_min
        if role == "gateway" and removed:
            rss_bound = round(rss_bound + remembered_mb_per_min(removed, got[0].t, got[-1].t), 3)
        metrics: list[tuple[str, list[float], float]] = [
            ("rss_mb", [s.rss_mb for s in got], rss_bound),
            ("fds", [float(s.fds) for s in got], bounds.fds_per_min),
        ]
        if role == "gateway":
            pairs = [(s.t, float(s.tasks)) for s in got if s.tasks is not None]
            metrics.append(("tasks", [v for _, v in pairs], bounds.tasks_per_min))
            tasks_ts = [t for t, _ in pairs]
        for metric, vs, bound in metrics:
            times = tasks_ts if metric == "tasks" else ts
            if len(vs) < 5:
                continue
            out.append(
                Series(role, pid, metric, len(vs), span, slope_per_min(times, vs), bound, vs[0], vs[-1])
            )
    return out


@dataclass
class Report:
    calls: Counter[str] = field(default_factory=Counter)
    ok: Counter[str] = field(default_factory=Counter)
    explained: Counter[str] = field(default_factory=Counter)
    unexplained: list[str] = field(default_factory=list)
    queue_acked: int = 0
    queue_lost: list[str] = field(default_factory=list)
    queue_redelivered: int = 0
    queue_phantoms: list[str] = field(default_factory=list)
    async_inputs: Counter[str] = field(default_factory=Counter)
    async_matched: Counter[str] = field(default_factory=Counter)
    async_errors_explained: int = 0
    async_findings: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)

    @property
    def sound(self) -> bool:
        return not (self.unexplained or self.queue_lost or self.queue_phantoms or self.async_findings)

    def summary(self) -> str:
        per = ", ".join(f"{p} {self.ok[p]}/{n}" for p, n in sorted(self.calls.items()))
        explained = dict(self.explained) or "-"
        return "\n".join(
            [
                f"  calls answered/made: {per}",
                f"  faults: {'; '.join(self.faults) or 'none'}",
                f"  failures explained by a fault: {explained}; unexplained: {len(self.unexplained)}"
                + (f" {self.unexplained[:5]}" if self.unexplained else ""),
                f"  queue: {self.queue_acked} acknowledged puts, lost {len(self.queue_lost)}, "
                f"read again (at least once) {self.queue_redelivered}, phantoms {len(self.queue_phantoms)}",
                "  asynchronous: "
                + ", ".join(
                    f"{p} {self.async_matched[p]}/{n} matched one to one"
                    for p, n in sorted(self.async_inputs.items())
                )
                + f"; error results explained by a kill {self.async_errors_explained}"
                + f"; findings {len(self.async_findings)}"
                + (f" {self.async_findings[:5]}" if self.async_findings else ""),
            ]
        )


def _windows(faults: Sequence[Mapping[str, Any]], grace_s: float) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for f in faults:
        if f["kind"] == "kill":
            out[f["service"]].append((f["start"], f["end"] + grace_s))
    return out


def check(
    events: Sequence[Mapping[str, Any]], faults: Sequence[Mapping[str, Any]], grace_s: float = 2.0
) -> Report:
    rep = Report()
    t0 = next((e["t"] for e in events if e.get("f") == "start"), 0.0)
    rep.faults = [
        f"{f['kind']} {f['service']}{' by ' + f['how'] if f.get('how') else ''} at {f['start'] - t0:.0f}s "
        f"(served again after {f['end'] - f['start']:.1f}s)"
        for f in faults
    ]
    windows = _windows(faults, grace_s)
    by_caller = {caller: svc for svc, callers in CALLERS.items() for caller in callers}

    def in_window(service: str | None, a: float, b: float) -> bool:
        return service is not None and any(b >= s and a <= e for s, e in windows.get(service, []))

    # Calls.
    for e in events:
        if "f" in e:
            continue
        p = e["p"]
        rep.calls[p] += 1
        if e["ok"]:
            rep.ok[p] += 1
            continue
        service = by_caller.get(p)
        status = e.get("status")
        grpc_unavailable = str(e.get("error") or "").startswith("grpc UNAVAILABLE")
        documented = status in DOCUMENTED_STATUSES or grpc_unavailable
        if documented and in_window(service, e["t0"], e["t1"]):
            rep.explained[f"{p} {status or 'UNAVAILABLE'}"] += 1
        else:
            rep.unexplained.append(f"{p} at {e['t0'] - t0:.1f}s: {status} {e.get('error')}")

    # The plain queue: at least once, nothing lost, nothing read that was never put.
    puts = [e for e in events if e.get("f") == "put"]
    reads = [e for e in events if e.get("f") == "read"]
    queue_put = {e["value"] for e in puts if e["p"] == "queue"}
    queue_read = Counter(e["result"] for e in reads if e["p"] == "queue")
    rep.queue_acked = len(queue_put)
    rep.queue_lost = sorted(queue_put - set(queue_read))
    rep.queue_redelivered = sum(n - 1 for n in queue_read.values())
    rep.queue_phantoms = sorted(set(queue_read) - queue_put)

    # Asynchronous inference: one result per input, and the right one.
    for service, p in ASYNC.items():
        inputs = {e["rid"]: e for e in puts if e["p"] == p}
        results: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in reads:
            if r["p"] == p:
                results[str(r.get("rid"))].append(r)
        rep.async_inputs[p] = len(inputs)
        for rid, put in inputs.items():
            got = results.get(rid, [])
            if not got:
                rep.async_findings.append(f"{p} {put['value']} ({rid}): no result")
                continue
            if len(got) > 1:
                rep.async_findings.append(f"{p} {put['value']} ({rid}): {len(got)} results")
                continue
            res = got[0]
            want = put.get("want", put["value"])
            what = f"{p} {put['value']} ({rid}): result"
            if res.get("status") is not None and str(res["status"]) != "200":
                if int(res["status"]) in DOCUMENTED_STATUSES and in_window(service, put["t"], res["t"]):
                    rep.async_errors_explained += 1
                    continue
                rep.async_findings.append(f"{what} status {res['status']}: {res['result']}")
            elif res["result"] != want:
                rep.async_findings.append(f"{what} {res['result']!r}, want {want!r}")
            else:
                rep.async_matched[p] += 1
        for rid in set(results) - set(inputs):
            rep.async_findings.append(f"{p}: a result for request id {rid}, which no input had")
    return rep
