"""Fixtures of the fault suite across hosts: namespaces, programs and mounts, each removed by
a finalizer even when the test fails, after a sweep of what a killed earlier run left."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults import netns
from tests.faults.cluster import Cluster
from tests.faults.scenario import stale_mounts, umount
from tests.opt_in import skip_unless_selected

HOSTS = ("redis", "gw1", "gw2", "worker", "client")
LONG = "faults_long"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_selected(config, items, LONG, f"the long fault schedule runs with -m {LONG} (minutes)")


@pytest.fixture(scope="session")
def namespaces_ok() -> None:
    why = netns.why_unavailable()
    if why is not None:
        pytest.skip(why)
    # What killed earlier runs left: their namespaces (with everything inside) and mounts.
    netns.remove_stale()
    for point in stale_mounts():
        umount(Path(point))


@pytest.fixture
def make_cluster(namespaces_ok: None, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(hosts: tuple[str, ...] = HOSTS, name: str = "run") -> Cluster:
        net = netns.Network.create(hosts)
        cluster = Cluster(net, tmp_path / name)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        try:
            cluster.close()
        finally:
            cluster.net.close()
    ours = {ns for c in made for ns in [c.net.hub, *(h.ns for h in c.net.hosts.values())]}
    left = [ns for ns in netns.list_namespaces() if ns in ours]
    assert not left, f"namespaces left behind: {left}"


@pytest.fixture
def tmpfs(namespaces_ok: None, tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """A small tmpfs mounted for the test, unmounted in the finalizer."""
    from tests.faults.scenario import mount_tmpfs

    mounted: list[Path] = []

    def make(size: str) -> Path:
        point = tmp_path / f"{netns.PREFIX}{os.getpid()}-disk"
        mount_tmpfs(point, size)
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        umount(point)
    still = [p for p in mounted if str(p) in Path("/proc/self/mounts").read_text()]
    assert not still, f"mounts left behind: {still}"
