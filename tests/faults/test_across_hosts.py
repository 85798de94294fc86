"""Faults between machines, Jepsen-style: two gateways on one Redis, a remote worker and a
load generator, each in a network namespace of its own, under a schedule of partitions,
pauses, restarts, packet loss and a full disk. The checker (checker.py) reads the whole
history afterwards; each test prints its report per fault.

Run: ``PYTHONPATH=. .venv/bin/python -m pytest tests/faults -m fault -s`` (the short
schedule, also in the default suite); ``-m faults_long`` for the long one (minutes).
Needs root, iproute2 and nftables (scripts/setup.sh installs them); skips without them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.faults.checker import Fault, Report
from tests.faults.cluster import FAKETIME_LIBS, Cluster
from tests.faults.scenario import (
    RECOVERY_BOUND_S,
    Step,
    clock_step,
    disk_full_step,
    lossy_step,
    partition_step,
    pause_step,
    redis_restart_step,
    run_schedule,
    wait_holder,
)

LEASE_S = 2.0


def _queue(cluster: Cluster) -> dict[str, Any]:
    return {"backend": cluster.redis_url, "owner_lease_s": LEASE_S, "heartbeat_s": 1.0}


def _two_gateways(cluster: Cluster, aof: bool = True, clock: bool = False) -> None:
    cluster.start_redis(aof=aof)
    cluster.start_gateway("gw1", _queue(cluster), clock=clock)  # the first takes the owner lease
    cluster.start_gateway("gw2", _queue(cluster), clock=clock)  # and this one forwards to it
    cluster.start_worker(("gw1", "gw2"))  # one remote worker in both gateways' pools


def _run(
    cluster: Cluster, steps: list[Step], gap_s: float = 2.0
) -> tuple[list[dict[str, Any]], list[Fault], Report]:
    """The load of the two-gateway runs: puts through both, the group consumer on gw2,
    predict calls through both (to the one remote worker), asynchronous inference on gw1."""
    return run_schedule(cluster, steps, ["gw1", "gw2"], "gw2", ["gw1", "gw2"], gap_s=gap_s, async_via="gw1")


def _report(title: str, rep: Report, faults: list[Fault]) -> None:
    print(f"\n== {title}\n{rep.summary(faults)}")


def _assert_sound(rep: Report) -> None:
    assert not rep.lost, rep.lost[:10]
    assert not rep.stored_twice, rep.stored_twice[:10]
    assert not rep.split_brain, rep.split_brain[:10]
    assert not rep.phantoms, rep.phantoms[:10]
    assert not rep.put_violations, rep.put_violations[:10]
    assert not rep.predict_violations, rep.predict_violations[:10]
    assert rep.acked_checked > 0
    for finding in ("async_lost", "async_stored_twice", "async_mismatched", "async_phantoms"):
        assert not getattr(rep, finding), (finding, getattr(rep, finding)[:10])


def _serving(cluster: Cluster) -> str:
    return wait_holder(cluster)


def short_schedule() -> list[Step]:
    return [
        partition_step("serving gateway | redis", _serving, "redis", 3 * LEASE_S),
        pause_step("serving gateway SIGSTOP past its lease", 3 * LEASE_S),
        partition_step("gw1 | gw2", "gw1", "gw2", 3.0),
        partition_step("worker | its gateway", "worker", "gw1", 3.0),
        redis_restart_step("redis kill -9, restart with AOF", aof=True, hold_s=1.5),
    ]


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_short_fault_schedule_across_hosts(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster()
    _two_gateways(cluster)
    _events, faults, rep = _run(cluster, short_schedule())
    _report(f"short schedule (recovery bound {RECOVERY_BOUND_S} s)", rep, faults)
    _assert_sound(rep)
    assert rep.async_acked > 0 and rep.async_matched > 0
    assert rep.lost_documented == []  # Redis kept its append-only file
    assert all(f.name in rep.recovery_s for f in faults)


@pytest.mark.fault
@pytest.mark.timeout(120)
def test_full_disk_under_the_embedded_store(
    make_cluster: Callable[..., Cluster], tmpfs: Callable[[str], Path]
) -> None:
    """One gateway, its SQLite store on a small tmpfs that fills up: puts are refused with
    507 while it is full, nothing acknowledged is lost, and the queue serves again once
    space is freed."""
    cluster = make_cluster(("gw1", "worker", "client"), name="disk")
    disk = tmpfs("16m")
    cluster.start_gateway(
        "gw1", {"backend": "sqlite", "heartbeat_s": 1.0, "max_bytes": 4 * 1024 * 1024}, data_dir=disk
    )
    cluster.start_worker(("gw1",))
    steps = [disk_full_step("disk full under SQLite", disk, hold_s=3.0)]
    _events, faults, rep = run_schedule(cluster, steps, ["gw1"], "gw1", "gw1")
    _report("full disk (single gateway, SQLite on tmpfs)", rep, faults)
    _assert_sound(rep)
    assert rep.put_statuses_in_faults.get("507", 0) > 0, "the disk never filled up"


@pytest.mark.fault
@pytest.mark.faults_long
@pytest.mark.timeout(600)
def test_long_fault_schedule_across_hosts(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster()
    _two_gateways(cluster)
    steps = [
        *short_schedule(),
        lossy_step("worker link 20 % loss, rate-limited", "worker", "gw1", 20, hold_s=8.0),
        lossy_step("serving gateway | redis 30 % loss", "gw1", "redis", 30, hold_s=8.0),
        partition_step("serving gateway | redis, long", _serving, "redis", 6 * LEASE_S),
        pause_step("serving gateway SIGSTOP, long", 6 * LEASE_S),
        partition_step("gw2 | redis", "gw2", "redis", 3 * LEASE_S),
        redis_restart_step("redis kill -9, restart with AOF, again", aof=True, hold_s=4.0),
        *short_schedule(),
    ]
    _events, faults, rep = _run(cluster, steps, gap_s=4.0)
    _report(f"long schedule (recovery bound {RECOVERY_BOUND_S} s)", rep, faults)
    _assert_sound(rep)


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_redis_restarted_without_its_data(make_cluster: Callable[..., Cluster]) -> None:
    """Redis without an append-only file, killed and restarted while the group consumer is
    behind: what it held is gone, as documented, counted apart and logged by the gateway
    that served the queues; everything acknowledged after the restart is read."""
    cluster = make_cluster()
    _two_gateways(cluster, aof=False)
    steps = [
        redis_restart_step(
            "redis kill -9 behind a lagging consumer, restart without AOF",
            aof=False,
            hold_s=1.5,
            backlog_s=1.5,
        )
    ]
    _events, faults, rep = _run(cluster, steps)
    _report("redis without persistence", rep, faults)
    _assert_sound(rep)
    # The consumer's backlog is gone, counted apart from any loss, and the gateway said so:
    # its lease vanished (Redis back before the lease would have run out), or ran out while
    # Redis was down (a slow restart on a busy machine); either way it served the queues
    # again from what Redis held.
    assert rep.lost_documented, "nothing was held when Redis restarted: the backlog never formed"
    logs = cluster.procs["gw1"].tail(1 << 20) + cluster.procs["gw2"].tail(1 << 20)
    said = ("vanished while this gateway held it", "expired while Redis was unreachable")
    assert any(s in logs for s in said), logs[-3000:]


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_clock_steps_on_a_gateway(make_cluster: Callable[..., Cluster]) -> None:
    """The serving gateway's wall clock jumps (libfaketime, read at run time) forward and back
    while it holds the owner lease: the lease and the queue run on monotonic time and on
    Redis's own expiry, so nothing is lost or written twice and no second gateway serves.
    A step within the signature's Date window (every real time zone's offset) refuses
    nothing; a step of two days makes that gateway refuse signed calls with 401 naming the
    skew, until its clock is right again."""
    if not FAKETIME_LIBS:
        pytest.skip("libfaketime is not installed (scripts/setup.sh installs it)")
    cluster = make_cluster()
    _two_gateways(cluster, clock=True)
    steps = [
        clock_step("serving gateway clock +3 h, then back", _serving, "+3h", hold_s=3 * LEASE_S),
        clock_step("serving gateway clock -5 h, then back", _serving, "-5h", hold_s=3 * LEASE_S),
        clock_step("gw1 clock +2 days, then back", "gw1", "+2d", hold_s=3.0),
    ]
    events, faults, rep = _run(cluster, steps)
    _report("clock steps on a gateway", rep, faults)
    _assert_sound(rep)
    refused = [e for e in events if e.get("status") == 401]
    assert refused, "no signed call was refused while gw1's clock was two days ahead"
    window = (faults[2].start, faults[2].heal + RECOVERY_BOUND_S)
    assert all(window[0] <= e["t1"] and e["t0"] <= window[1] for e in refused), refused[:3]
    assert any("skew" in str(e.get("error")) for e in refused), refused[:3]
