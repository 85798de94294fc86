"""Canary releases through the real gateway: a new version that fails a share of its calls
is rolled back by the gateway itself with no failed call on the old version, a healthy one
is promoted all at once (blue-green) and switched back in one traffic change with no call
lost, a canary under way can be aborted, and each bad canary is refused precisely.

Each version is the same python processor given a model file of its own, which says which
version it is and how often it raises (every Nth call: a share, never by chance)."""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.gateway_proc import GatewayProcess
from tests.e2e.test_services_e2e import ADMIN_TOKEN, cli
from tests.e2e.test_traffic_e2e import _admin
from tests.waiting import wait_until

PROCESSOR = """
class Flaky:
    config = {}
    model_path = None

    def initialize(self):
        version, fail_every = open(self.model_path).read().split()
        self.version, self.fail_every, self.calls = version, int(fail_every), 0

    def process(self, data):
        self.calls += 1
        if self.fail_every and self.calls % self.fail_every == 0:
            raise RuntimeError("version " + self.version + " failed on purpose")
        return ("version " + self.version).encode(), 200
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("gw-canary")
    (workdir / "flaky.py").write_text(PROCESSOR)
    versions = {}
    for version, fail_every in ((1, 0), (2, 5), (3, 0)):  # version 2 fails one call in five
        (workdir / f"v{version}.txt").write_text(f"{version} {fail_every}")
        versions[version] = str(workdir / f"v{version}.txt")
    config = {
        "admin": {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN},
        "gateway": {"shutdown_timeout_s": 5},
        "services": [
            {
                "name": "c", "processor": "python", "entry": f"{workdir / 'flaky.py'}:Flaky", "public": True,
                "versions": versions, "traffic": {1: 100},
            },
            {"name": "one", "processor": "python", "entry": f"{workdir / 'flaky.py'}:Flaky", "public": True,
             "model": versions[1]},
        ],
    }  # fmt: skip
    proc = GatewayProcess.start(config, workdir)
    try:
        proc.wait_workers_ready("c", 1)
        proc.wait_workers_ready("one", 1)
        for v in ("1", "2"):
            wait_until(lambda v=v: _call(proc, {"X-Model-Version": v})[0] == 200, 60, f"version {v} ready")
        yield proc
    finally:
        proc.kill()


def _call(gw: GatewayProcess, headers: dict[str, str] | None = None) -> tuple[int, str | None, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        conn.request("POST", "/api/predict/c", body=b"x", headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("X-Model-Version"), resp.read()
    finally:
        conn.close()


class Load:
    """Calls the service without naming a version until stopped: (version, status) counted."""

    def __init__(self, gw: GatewayProcess) -> None:
        self.gw, self.seen, self.stop = gw, Counter(), threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.gw.port, timeout=30)
        try:
            while not self.stop.is_set():
                conn.request("POST", "/api/predict/c", body=b"x")
                resp = conn.getresponse()
                resp.read()
                self.seen[(resp.getheader("X-Model-Version"), resp.status)] += 1
        finally:
            conn.close()

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()


def _traffic(gw: GatewayProcess) -> dict[str, int]:
    return _admin(gw, "GET", "/admin/services/c")[1]["spec"]["traffic"]


@pytest.mark.parametrize(
    ("name", "doc", "status", "message"),
    [
        ("one", {"version": 2}, 400, "canary: service 'one' serves one version"),
        ("c", {"version": 7}, 400, "canary.version: '7' is not one the service serves (1, 2, 3)"),
        ("c", {"version": 1}, 400, "canary.version: version 1 already takes the calls that name no version"),
        ("c", {"version": 2, "steps": [50, 25]}, 400, "canary.steps: expected rising percents, got [50, 25]"),
        (
            "c",
            {"version": 2, "steps": [0, 100]},
            400,
            "canary.steps: expected whole percents from 1 to 100, got 0",
        ),
        (
            "c",
            {"version": 2, "interval_s": "soon"},
            400,
            "canary.interval_s: expected a duration such as 60s",
        ),
        (
            "c",
            {"version": 2, "max_p99_ratio": 0.5},
            400,
            "canary.max_p99_ratio: expected a number from 1 to 1000",
        ),
        ("c", {"version": 2, "speed": 1}, 400, "canary: unknown key 'speed'"),
        ("nope", {"version": 2}, 404, "service 'nope' not found"),
    ],
)
def test_a_bad_canary_is_refused_and_the_split_stays(
    gw: GatewayProcess, name: str, doc: dict[str, Any], status: int, message: str
) -> None:
    got, err = _admin(gw, "POST", f"/admin/services/{name}/canary", doc)
    assert got == status and message in err["message"], err
    assert _traffic(gw) == {"1": 100}


def test_a_canary_under_way_can_be_aborted(gw: GatewayProcess) -> None:
    out = cli(
        gw, "services", "canary", "c", "--version", "3", "--steps", "50,100", "--interval", "10m", "--no-wait"
    )
    assert out.returncode == 0, out.stderr
    wait_until(lambda: _traffic(gw) == {"1": 50, "3": 50}, 10, "the first step's split")
    again, err = _admin(gw, "POST", "/admin/services/c/canary", {"version": 3})
    assert again == 409 and "has a canary of version 3 under way; abort it first" in err["message"]
    out = cli(gw, "services", "canary", "c", "--abort")
    assert out.returncode == 0 and "canary aborted; traffic: version 1: 100%" in out.stdout, out
    described = _admin(gw, "GET", "/admin/services/c")[1]
    assert described["canary"]["phase"] == "aborted" and described["history"][-1]["phase"] == "aborted"


def test_a_failing_version_is_rolled_back_with_no_failed_call_on_the_old_one(gw: GatewayProcess) -> None:
    with Load(gw) as load:
        out = cli(
            gw, "services", "canary", "c", "--version", "2", "--steps", "20,50,100", "--interval", "1s",
            "--min-calls", "10",
        )  # fmt: skip
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "service c: version 2 rolled back at 20%: version 2 failed" in out.stdout, out.stdout
    assert out.stdout.strip().endswith("traffic: version 1: 100%"), out.stdout
    assert "version 2 takes 20% (step 1/3" in out.stderr and "at 20%: version 2 failed" in out.stderr
    assert _traffic(gw) == {"1": 100}
    # The old version failed no call; the new one failed a share of its own, which rolled it back.
    assert load.seen[("1", 200)] > 0 and not [k for k in load.seen if k[0] == "1" and k[1] != 200], load.seen
    assert load.seen[("2", 400)] >= 1, load.seen
    history = _admin(gw, "GET", "/admin/services/c")[1]["history"][-1]
    assert history["phase"] == "rolled back" and history["version"] == "2" and history["percent"] == 20
    assert history["windows"][0]["new"]["failed"] >= 1 and history["windows"][0]["old"]["failed"] == 0


def test_blue_green_switches_at_once_and_back_without_losing_a_call(gw: GatewayProcess) -> None:
    with Load(gw) as load:
        out = cli(gw, "services", "canary", "c", "--version", "3", "--interval", "1s", "--min-calls", "10")
        assert out.returncode == 0, (out.stdout, out.stderr)
        assert "service c: version 3 promoted; traffic: version 1: 0%, version 3: 100%" in out.stdout, (
            out.stdout
        )
        wait_until(lambda: load.seen[("3", 200)] >= 10, 30, "calls served by version 3")
        # The old version kept its workers: switching back is one traffic change.
        switched = cli(gw, "services", "traffic", "c", "1=100", "3=0")
        assert switched.returncode == 0, switched.stderr
        before = load.seen[("1", 200)]
        wait_until(lambda: load.seen[("1", 200)] >= before + 10, 30, "calls served by version 1 again")
    assert set(load.seen) <= {("1", 200), ("3", 200)}, load.seen
    assert _admin(gw, "GET", "/admin/services/c")[1]["history"][-1]["phase"] == "promoted"
