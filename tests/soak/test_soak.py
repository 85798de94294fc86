"""The soak: mixed load on every protocol against one real gateway, a worker killed and the
config reloaded on a schedule, memory, file descriptors and tasks sampled (load.py); judged
by checker.py. The short run is part of the default suite; the long one runs by hand:

    .venv/bin/python -m pytest tests/soak -m soak --soak-minutes 30 -s

(or ``EASKIT_SOAK_MINUTES=30``). Each prints its report: the calls per protocol, the faults,
the failures each fault explains, the queue and asynchronous results, and a fitted slope per
process and figure against its bound.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.soak.checker import (
    REMEMBERED_ID_BYTES,
    Bounds,
    Series,
    check,
    growth,
    remembered_mb_per_min,
    removals,
    slope_per_min,
)
from tests.soak.load import Soak, started

# The short run: the same code on 75 s with a fault every 15 s (a kill, a reload that adds a
# service, a kill, a reload that removes it: the descriptors and tasks a service holds
# come and go within the judged stretch). Its bounds are looser per
# minute (a line fitted through 50 s of a Python process's memory is mostly noise: a few MB
# of allocator arenas either way), and still far under what a leak of a few kilobytes per
# call at the run's ~150 calls/s would give (a KB per call is ~9 MB/min).
SHORT = {"duration_s": 75.0, "fault_every_s": 15.0, "sample_every_s": 1.0}
SHORT_BOUNDS = Bounds(warmup_s=20.0, rss_mb_per_min=8.0, fds_per_min=6.0, tasks_per_min=12.0)
# The long run: samples after the first five minutes; a line over 25 minutes. 0.5 MB/min is
# 12.5 MB over the run: growth past it at this call rate is a leak of a few bytes per call.
LONG_BOUNDS = Bounds(warmup_s=300.0, rss_mb_per_min=0.5, fds_per_min=0.2, tasks_per_min=0.5)


def _minutes(config: pytest.Config) -> float:
    opt = config.getoption("--soak-minutes")
    return float(opt if opt is not None else os.environ.get("EASKIT_SOAK_MINUTES", 30))


def _run(
    tmp_path: Path, duration_s: float, fault_every_s: float, sample_every_s: float, bounds: Bounds
) -> None:
    with started(tmp_path) as (gw, grpc_port, admin_port):
        soak = Soak(gw, tmp_path, grpc_port, admin_port, duration_s, fault_every_s, sample_every_s)
        soak.run()
        events = soak.history.events
        t_start = next(e["t"] for e in events if e.get("f") == "start")
        t_end = next(e["t"] for e in events if e.get("f") == "end")
        removed = removals(events)
        series = growth(soak.samples, t_start, t_end, bounds, removed)
        judged = (t_start + bounds.warmup_s, t_end)
        rep = check(events, soak.faults)
        alive = gw.proc.poll() is None
    print(f"\n== soak of {duration_s / 60:.1f} min (history: {soak.history.path})")
    print(rep.summary())
    allowance = remembered_mb_per_min(removed, *judged)
    print(
        f"  growth after the first {bounds.warmup_s:.0f} s (the gateway's RSS bound includes "
        f"{allowance:.2f} MB/min for the queues' remembered request ids filling up):"
    )
    for s in series:
        print("    " + s.line())
    assert alive, "the gateway exited during the soak"
    assert rep.sound, rep.summary()
    assert {"eas", "v1", "v2", "grpc", "paddle", "cluster_serving"} <= {p for p, n in rep.ok.items() if n}
    assert rep.queue_acked > 0 and all(rep.async_matched.values()) and len(rep.async_matched) == 2
    assert {f.split()[0] for f in rep.faults} == {"kill", "reload"}
    assert any(s.role == "gateway" for s in series) and any(s.role == "digits" for s in series)
    grows = [s.line() for s in series if not s.ok]
    assert not grows, "\n".join(grows)


@pytest.mark.load
@pytest.mark.fault
@pytest.mark.timeout(300)
def test_short_soak(tmp_path: Path, digits_model: Path) -> None:
    _run(tmp_path, bounds=SHORT_BOUNDS, **SHORT)


@pytest.mark.soak
@pytest.mark.load
@pytest.mark.fault
@pytest.mark.timeout(0)
def test_long_soak(tmp_path: Path, digits_model: Path, request: pytest.FixtureRequest) -> None:
    minutes = _minutes(request.config)
    _run(tmp_path, minutes * 60, fault_every_s=150.0, sample_every_s=10.0, bounds=LONG_BOUNDS)


def test_the_growth_check_finds_a_leak_and_passes_noise() -> None:
    """The checker's own baseline: a flat noisy series passes, a slow steady climb does not."""

    class S:
        def __init__(self, t: float, rss: float) -> None:
            self.t, self.pid, self.role, self.rss_mb, self.fds, self.tasks = t, 1, "gateway", rss, 20, 30

    bounds = Bounds(warmup_s=10.0, rss_mb_per_min=1.0, fds_per_min=1.0, tasks_per_min=1.0)
    noisy = [S(t, 100.0 + (3.0 if t % 7 < 1 else 0.0)) for t in range(0, 600, 5)]
    leak = [S(t, 100.0 + t * 2.0 / 60) for t in range(0, 600, 5)]  # 2 MB/min
    by = {
        tuple(s.metric for s in growth(x, 0.0, 600.0, bounds)): growth(x, 0.0, 600.0, bounds)
        for x in (noisy,)
    }
    assert all(s.ok for s in next(iter(by.values())))
    found = {s.metric: s for s in growth(leak, 0.0, 600.0, bounds)}
    assert not found["rss_mb"].ok and found["fds"].ok
    assert abs(slope_per_min([0, 60, 120], [1, 2, 3]) - 1.0) < 1e-9
    # The same climb, where the queues' remembered ids grew that much: allowed for.
    per_min = 2.0 * 2**20 / REMEMBERED_ID_BYTES  # removals a minute that cost 2 MB/min
    removed = {"jobs": [i * 60.0 / per_min for i in range(int(per_min * 10))]}
    assert abs(remembered_mb_per_min(removed, 0.0, 600.0) - 2.0) < 0.01
    allowed = {s.metric: s for s in growth(leak, 0.0, 600.0, bounds, removed)}
    assert allowed["rss_mb"].ok and allowed["rss_mb"].bound > 2.0
    assert isinstance(found["rss_mb"], Series)


def test_the_failure_check_wants_a_fault_to_explain_each_failure() -> None:
    start = {"p": "soak", "f": "start", "t": 0.0}
    kill = {"kind": "kill", "service": "echo", "start": 10.0, "end": 12.0}
    in_window = {"p": "eas", "t0": 11.0, "t1": 11.1, "ok": False, "status": 503, "error": "no worker"}
    late = {"p": "eas", "t0": 30.0, "t1": 30.1, "ok": False, "status": 503, "error": "no worker"}
    wrong_service = {"p": "v2", "t0": 11.0, "t1": 11.1, "ok": False, "status": 503, "error": "x"}
    undocumented = {"p": "eas", "t0": 11.0, "t1": 11.1, "ok": False, "status": 500, "error": "x"}
    rep = check([start, in_window, late, wrong_service, undocumented], [kill])
    assert rep.explained == {"eas 503": 1}
    assert len(rep.unexplained) == 3 and not rep.sound
    # Asynchronous results: a missing one, a second one and another input's are all found.
    puts = [{"p": "async_eas", "f": "put", "value": f"v{n}", "rid": f"r{n}", "t": 1.0} for n in range(4)]

    def read(rid: str, result: str) -> dict[str, object]:
        return {"p": "async_eas", "f": "read", "rid": rid, "status": "200", "result": result, "t": 2.0}

    reads = [read("r0", "v0"), read("r1", "v1"), read("r1", "v1"), read("r2", "v3"), read("r9", "v9")]
    rep = check([start, *puts, *reads], [])
    assert rep.async_matched["async_eas"] == 1
    found = " | ".join(rep.async_findings)
    for what in ("v1 (r1): 2 results", "v2 (r2): result 'v3'", "v3 (r3): no result", "request id r9"):
        assert what in found, found
