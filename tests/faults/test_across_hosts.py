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
from tests.faults.cluster import Cluster
from tests.faults.scenario import (
    RECOVERY_BOUND_S,
    Step,
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


def _two_gateways(cluster: Cluster, aof: bool = True) -> None:
    cluster.start_redis(aof=aof)
    cluster.start_gateway("gw1", _queue(cluster))  # the first takes the owner lease
    cluster.start_gateway("gw2", _queue(cluster))  # and this one forwards to it
    cluster.start_worker("gw1")


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
    _events, faults, rep = run_schedule(cluster, short_schedule(), ["gw1", "gw2"], "gw2", "gw1")
    _report(f"short schedule (recovery bound {RECOVERY_BOUND_S} s)", rep, faults)
    _assert_sound(rep)
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
    cluster.start_worker("gw1")
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
    _events, faults, rep = run_schedule(cluster, steps, ["gw1", "gw2"], "gw2", "gw1", gap_s=4.0)
    _report(f"long schedule (recovery bound {RECOVERY_BOUND_S} s)", rep, faults)
    _assert_sound(rep)


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_redis_restarted_without_its_data(make_cluster: Callable[..., Cluster]) -> None:
    """Redis without an append-only file, killed and restarted: what it held is gone, as
    documented, and counted apart; everything acknowledged after the restart is read."""
    cluster = make_cluster()
    _two_gateways(cluster, aof=False)
    steps = [redis_restart_step("redis kill -9, restart without AOF", aof=False, hold_s=1.5)]
    _events, faults, rep = run_schedule(cluster, steps, ["gw1", "gw2"], "gw2", "gw1")
    _report("redis without persistence", rep, faults)
    _assert_sound(rep)
