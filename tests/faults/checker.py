"""Reads a whole fault run's history (loadgen.py) and the faults injected, and judges it.

Queue, from the puts and the group consumer's reads:
* **lost**: an acknowledged put never read. A put acknowledged before Redis restarted
  without persistence (``appendonly no``) and not read by then is counted apart as
  ``lost_documented``: docs/queue.md says such a restart keeps nothing. The gateway that
  served the queues logs that its lease vanished and serves them again from what Redis
  holds, so the loss is not silent.
* **duplicated**: reads beyond the first of one value, split by their explanation:
  ``redelivered`` (the same index again: at-least-once after a commit that failed or was
  not answered, a watch that reconnected, a takeover) and ``stored_twice`` (one value at
  two indexes: a retried put stored again, which the request id must prevent).
* **split brain**, any of: two values read at one index; a value read at another index
  than its put was acknowledged with; and indexes out of real-time order (a put
  acknowledged before another began got the larger index), which is what two gateways
  allocating at once from their own counters leave behind.

Asynchronous inference, from the inputs put to an asynchronous service and the results its
sink's watcher read: every acknowledged input has exactly one result, under its request id,
holding what that input's processing gives (the echo: the input itself). ``async_lost``: an
input without a result; ``async_stored_twice``: one request id at two sink indexes (the
sink must refuse the second); ``async_mismatched``: a result that is not its input's;
``async_phantoms``: a result for a request id no put was sent with. The same result read
again at its index (an unacknowledged commit, a watch that reconnected) is counted as
``async_redelivered``.

Predict: during a fault (from its injection to its heal) a call fails only with a
documented status (450, 503, 504, 408: reliability.md D6); outside every fault none
fails; every call begun later than ``recovery_bound_s`` after a heal succeeds. The time
to recover is from the heal to the last failure after it (0 when none failed).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DOCUMENTED_PREDICT_STATUSES = frozenset({408, 450, 503, 504})
# A queue call refused while its store or its serving gateway is out of reach (docs/queue.md):
# 503 with Retry-After (no gateway serves it yet, loading, its serving gateway changed),
# 507 (the store refuses writes), 429 (full). Without a status: the SDK's own timeout.
DOCUMENTED_QUEUE_STATUSES = frozenset({429, 503, 507, None})


@dataclass
class Fault:
    name: str
    start: float
    heal: float
    # A Redis restart without its append-only file: what was acknowledged before ``start``
    # and not yet read may be gone, as documented.
    documented_loss: bool = False
    # The gateway the predict calls go to cannot answer at all (it is paused): a call then
    # ends in the client's own timeout, with no status.
    silent: bool = False
    # The gateways (base URLs) that cannot answer at all during the fault.
    silenced: list[str] = field(default_factory=list)
    # Statuses this fault documents beyond the usual ones (a gateway whose clock jumped past
    # the signature window answers signed calls 401 naming the skew).
    allowed: list[int] = field(default_factory=list)

    def silences(self, via: str | None) -> bool:
        return self.silent or (via is not None and via in self.silenced)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "start": self.start,
            "heal": self.heal,
            "documented_loss": self.documented_loss,
            "silent": self.silent,
            "silenced": list(self.silenced),
            "allowed": list(self.allowed),
        }


@dataclass
class Report:
    t_start: float = 0.0  # the load's start: times in the summary count from it
    duration_s: float = 0.0
    puts: int = 0
    puts_ok: int = 0
    puts_failed: int = 0
    puts_unknown: int = 0
    reads: int = 0
    predicts: int = 0
    predicts_ok: int = 0
    acked_checked: int = 0
    lost: list[str] = field(default_factory=list)
    lost_documented: list[str] = field(default_factory=list)
    redelivered: int = 0
    redelivered_after_failed_commit: int = 0
    stored_twice: list[str] = field(default_factory=list)
    unknown_puts_read: int = 0
    split_brain: list[str] = field(default_factory=list)
    phantoms: list[str] = field(default_factory=list)
    predict_violations: list[str] = field(default_factory=list)
    put_violations: list[str] = field(default_factory=list)
    put_statuses_in_faults: dict[str, int] = field(default_factory=dict)
    predict_statuses_in_faults: dict[str, int] = field(default_factory=dict)
    recovery_s: dict[str, float] = field(default_factory=dict)
    queue_recovery_s: dict[str, float] = field(default_factory=dict)
    async_acked: int = 0
    async_matched: int = 0
    async_error_results: dict[str, int] = field(default_factory=dict)
    async_lost: list[str] = field(default_factory=list)
    async_stored_twice: list[str] = field(default_factory=list)
    async_mismatched: list[str] = field(default_factory=list)
    async_phantoms: list[str] = field(default_factory=list)
    async_redelivered: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.async_lost
            or self.async_stored_twice
            or self.async_mismatched
            or self.async_phantoms
            or self.lost
            or self.stored_twice
            or self.split_brain
            or self.phantoms
            or self.predict_violations
            or self.put_violations
        )

    def summary(self, faults: Sequence[Fault]) -> str:
        def few(items: Sequence[str], n: int = 5) -> str:
            return f" {list(items[:n])}" if items else ""

        injected = ", ".join(
            f"{f.name} at {f.start - self.t_start:.1f}s, healed at {f.heal - self.t_start:.1f}s"
            for f in faults
        )
        documented = f"; lost as documented (Redis without AOF): {len(self.lost_documented)}"
        queued = self.queue_recovery_s
        predict_seen = dict(sorted(self.predict_statuses_in_faults.items())) or "-"
        put_seen = dict(sorted(self.put_statuses_in_faults.items())) or "-"
        recover = ", ".join(
            f"{f.name} {self.recovery_s.get(f.name, 0.0):.1f}s / {queued.get(f.name, 0.0):.1f}s"
            for f in faults
        )
        lines = [
            f"  load held: {self.duration_s:.1f} s; puts {self.puts} ({self.puts_ok} acknowledged, "
            f"{self.puts_failed} refused, {self.puts_unknown} unknown); reads {self.reads}; "
            f"predicts {self.predicts} ({self.predicts_ok} ok)",
            f"  faults injected: {injected or 'none'}",
            f"  acknowledged records checked: {self.acked_checked}",
            f"  lost: {len(self.lost)}{few(self.lost)}" + (documented if self.lost_documented else ""),
            f"  duplicated: {self.redelivered + len(self.stored_twice)} = {self.redelivered} redelivered "
            f"at their index (at least once; {self.redelivered_after_failed_commit} after a commit "
            "that failed or went unanswered, the rest after a watch reconnect or a takeover) + "
            f"{len(self.stored_twice)} stored twice{few(self.stored_twice)}",
            f"  unknown puts that were stored: {self.unknown_puts_read}",
            f"  split brain: {len(self.split_brain)}{few(self.split_brain)}",
            f"  predict statuses during faults: {predict_seen}"
            f"; violations: {len(self.predict_violations)}{few(self.predict_violations)}",
            f"  put statuses during faults: {put_seen}"
            f"; violations: {len(self.put_violations)}{few(self.put_violations, 3)}",
            f"  time to recover (predict / queue puts): {recover}",
        ]
        if self.async_acked:
            lines.append(
                f"  asynchronous: {self.async_acked} acknowledged inputs, {self.async_matched} matched to "
                f"one result each (error results {dict(self.async_error_results) or '-'}); lost "
                f"{len(self.async_lost)}{few(self.async_lost)}, stored twice {len(self.async_stored_twice)}"
                f"{few(self.async_stored_twice)}, mismatched {len(self.async_mismatched)}"
                f"{few(self.async_mismatched)}, phantoms {len(self.async_phantoms)}; read again at "
                f"their index {self.async_redelivered}"
            )
        return "\n".join(lines)


def load_history(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            events.append(json.loads(line))
    return events


def check(
    events: Iterable[Mapping[str, Any]], faults: Sequence[Fault], recovery_bound_s: float = 10.0
) -> Report:
    events = list(events)
    rep = Report()
    starts = [e["t0"] for e in events if e["f"] == "start"]
    ends = [e["t0"] for e in events if e["f"] == "end"]
    t_start = starts[0] if starts else min((e["t0"] for e in events), default=0.0)
    t_end = ends[-1] if ends else max((e["t1"] for e in events), default=0.0)
    rep.t_start = t_start
    rep.duration_s = t_end - t_start
    rel = lambda t: t - t_start  # noqa: E731 - times in messages, from the load's start

    puts = [e for e in events if e["f"] == "put"]
    reads = [e for e in events if e["f"] == "read"]
    commits = [e for e in events if e["f"] == "commit"]
    rep.puts = len(puts)
    rep.reads = len(reads)
    acked = {e["value"]: e for e in puts if e["type"] == "ok"}
    rep.puts_ok = len(acked)
    rep.puts_failed = sum(1 for e in puts if e["type"] == "fail")
    unknown = {e["value"] for e in puts if e["type"] == "info"}
    rep.puts_unknown = len(unknown)
    rep.acked_checked = len(acked)
    put_values = {e["value"] for e in puts}

    by_value: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    by_index: dict[int, set[str]] = defaultdict(set)
    for r in reads:
        by_value[r["value"]].append(r)
        by_index[r["index"]].add(r["value"])
    failed_commits = {c["index"] for c in commits if c["type"] != "ok"}
    lossy = [f for f in faults if f.documented_loss]

    def documented_gap(t0: float, t1: float) -> bool:
        """A restart that keeps nothing between two moments: indexes may start again. The
        earlier moment may fall inside the fault (an answer Redis gave as it was killed)."""
        return any(t0 <= f.heal and f.start <= t1 for f in lossy)

    # Loss.
    for value, put in acked.items():
        if value in by_value:
            continue
        # Acknowledged before Redis came back: an acknowledgement can come while the kill is
        # under way (Redis answered, then died), never from the restarted server.
        if any(put["t1"] <= f.heal for f in lossy):
            rep.lost_documented.append(value)
        else:
            rep.lost.append(f"{value} (index {put['index']}, acknowledged at {rel(put['t1']):.2f}s)")
    rep.unknown_puts_read = sum(1 for v in unknown if v in by_value)
    rep.phantoms = [f"{v} read but never put" for v in by_value if v not in put_values]

    # Duplicates and index agreement.
    for value, got in by_value.items():
        indexes = sorted({r["index"] for r in got})
        if len(indexes) > 1 and not documented_gap(got[0]["t0"], got[-1]["t0"]):
            rep.stored_twice.append(f"{value} at indexes {indexes}")
        for index in indexes:
            copies = sum(1 for r in got if r["index"] == index)
            rep.redelivered += copies - 1
            if copies > 1 and index in failed_commits:
                rep.redelivered_after_failed_commit += copies - 1
        put = acked.get(value)
        if put is not None and put["index"] not in indexes and not documented_gap(put["t1"], got[0]["t0"]):
            rep.split_brain.append(f"{value}: put acknowledged index {put['index']}, read at {indexes}")
    for index, values in by_index.items():
        if len(values) > 1:
            # When each value was stored: its put's acknowledgement (else its first read). A
            # restart that keeps nothing between two of them gives the index out again.
            times = [
                acked[v]["t1"] if v in acked else min(r["t0"] for r in by_value[v] if r["index"] == index)
                for v in values
            ]
            if not documented_gap(min(times), max(times)):
                rep.split_brain.append(f"index {index} holds {sorted(values)}")

    # Real-time order of index allocation: sweep the acknowledged puts by invocation,
    # knowing the largest index of every put completed before each one began.
    done = sorted(acked.values(), key=lambda e: e["t1"])
    began = sorted(acked.values(), key=lambda e: e["t0"])
    best: tuple[int, Mapping[str, Any]] | None = None
    i = 0
    for put in began:
        while i < len(done) and done[i]["t1"] < put["t0"]:
            if best is None or done[i]["index"] > best[0]:
                best = (done[i]["index"], done[i])
            i += 1
        if best is not None and put["index"] <= best[0] and not documented_gap(best[1]["t1"], put["t0"]):
            rep.split_brain.append(
                f"{put['value']} got index {put['index']} at {rel(put['t0']):.2f}s after {best[1]['value']} "
                f"was acknowledged with index {best[0]} at {rel(best[1]['t1']):.2f}s"
            )

    # Predict.
    predicts = [e for e in events if e["f"] == "predict"]
    rep.predicts = len(predicts)
    rep.predicts_ok = sum(1 for e in predicts if e["type"] == "ok")
    statuses: dict[str, int] = defaultdict(int)
    for e in predicts:
        if e["type"] == "ok":
            continue
        what = str(e.get("status") or e.get("error", "?").split(":")[0])
        during = [f for f in faults if e["t0"] <= f.heal + recovery_bound_s and e["t1"] >= f.start]
        if not during:
            rep.predict_violations.append(
                f"{rel(e['t0']):.2f}s outside any fault: {e.get('status')} {e.get('error')}"
            )
            continue
        statuses[what] += 1
        allowed = DOCUMENTED_PREDICT_STATUSES.union(*(f.allowed for f in during))
        if e.get("status") is None and any(f.silences(e.get("via")) for f in during):
            pass  # the called gateway was paused: only the client's timeout can end the call
        elif e.get("status") not in allowed:
            rep.predict_violations.append(f"{rel(e['t0']):.2f}s: undocumented {what}: {e.get('error')}")
        elif all(e["t0"] > f.heal + recovery_bound_s for f in during):
            rep.predict_violations.append(f"{rel(e['t0']):.2f}s: failed {recovery_bound_s} s after the heal")
    rep.predict_statuses_in_faults = dict(statuses)

    # Puts fail only as documented, and only during a fault or within the bound after it.
    put_statuses: dict[str, int] = defaultdict(int)
    for e in puts:
        if e["type"] == "ok":
            continue
        during = [f for f in faults if e["t0"] <= f.heal + recovery_bound_s and e["t1"] >= f.start]
        what = str(e.get("status") or e.get("error", "?").split(":")[0])
        if not during:
            rep.put_violations.append(
                f"{rel(e['t0']):.2f}s outside any fault: {e.get('status')} {e.get('error')}"
            )
            continue
        put_statuses[what] += 1
        if e.get("status") not in DOCUMENTED_QUEUE_STATUSES.union(*(f.allowed for f in during)):
            rep.put_violations.append(f"{rel(e['t0']):.2f}s {e['p']}: undocumented {what}: {e.get('error')}")
    rep.put_statuses_in_faults = dict(put_statuses)

    _check_async(events, rep)

    ordered = sorted(faults, key=lambda f: f.start)
    for n, f in enumerate(ordered):
        # This fault's failures: from its injection until the next fault's.
        until = ordered[n + 1].start if n + 1 < len(ordered) else float("inf")
        failures = [e["t1"] for e in predicts if e["type"] != "ok" and f.start <= e["t0"] < until]
        after = [t for t in failures if t >= f.heal]
        rep.recovery_s[f.name] = max(after) - f.heal if after else 0.0
        # The queue: from the heal to the first put acknowledged after it by every producer.
        producers = {e["p"] for e in puts}
        firsts = []
        for p in producers:
            oks = [e["t1"] for e in puts if e["p"] == p and e["type"] == "ok" and e["t0"] >= f.heal]
            if oks:
                firsts.append(min(oks) - f.heal)
        rep.queue_recovery_s[f.name] = max(firsts) if len(firsts) == len(producers) else float("inf")
        if len(firsts) < len(producers) or max(firsts) > recovery_bound_s:
            rep.put_violations.append(
                f"puts not acknowledged again within {recovery_bound_s} s of healing {f.name}"
            )
    return rep


def _check_async(events: Sequence[Mapping[str, Any]], rep: Report) -> None:
    """Asynchronous results against their inputs, one to one (see the module's doc)."""
    aputs = [e for e in events if e["f"] == "aput"]
    areads = [e for e in events if e["f"] == "aread"]
    acked = {e["rid"]: e for e in aputs if e["type"] == "ok"}
    sent = {e["rid"] for e in aputs if e.get("rid")} | set(acked)
    # A put whose answer was lost has no request id in the history; its value names it.
    unknown_values = {e["value"] for e in aputs if e["type"] != "ok"}
    rep.async_acked = len(acked)
    results: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in areads:
        results[r["rid"]].append(r)
    errors: dict[str, int] = defaultdict(int)
    for rid, put in acked.items():
        got = results.get(rid, [])
        if not got:
            rep.async_lost.append(f"{put['value']} ({rid})")
            continue
        indexes = sorted({r["index"] for r in got})
        rep.async_redelivered += len(got) - len(indexes)
        if len(indexes) > 1:
            rep.async_stored_twice.append(f"{put['value']} ({rid}) at sink indexes {indexes}")
            continue
        status = str(got[0].get("status") or "200")
        if status != "200":
            errors[status] += 1  # a result all the same: the processing's outcome, once
        elif got[0]["value"] != put["value"]:
            rep.async_mismatched.append(f"{put['value']} ({rid}) answered {got[0]['value']!r}")
            continue
        rep.async_matched += 1
    rep.async_error_results = dict(errors)
    for rid, got in results.items():
        if rid not in sent and got[0]["value"] not in unknown_values:
            rep.async_phantoms.append(f"{rid}: {got[0]['value']!r}")


def dump(path: Path, events: Sequence[Mapping[str, Any]], faults: Sequence[Fault], note: str) -> None:
    """Keep a run's history as test data: the events, the faults, and why it is kept."""
    path.write_text(
        json.dumps(
            {"note": note, "faults": [f.to_json() for f in faults], "events": list(events)}, indent=None
        ),
        encoding="utf-8",
    )
