"""A ready gateway has frozen its start-up's objects out of the garbage collector's full
scans (what keeps those scans, which stop every call, to milliseconds), says so in
``/metrics`` beside the collector's own figures, and freezes its heap again once a service
it stopped has let go of what it held."""

from __future__ import annotations

import re
import urllib.request
from typing import Any

from tests.e2e.gateway_proc import ECHO_ENTRY, GatewayProcess
from tests.e2e.test_services_e2e import ADMIN_TOKEN, admin_url, http
from tests.waiting import wait_until


def _frozen(gw: GatewayProcess) -> float:
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert re.search(r'^python_gc_collections_total\{generation="2"\} \S+$', text, re.M)
    (frozen,) = re.findall(r"^python_gc_frozen_objects (\S+)$", text, re.M)
    return float(frozen)


def test_the_gateway_freezes_its_start_up_heap_and_again_after_a_service_stops(
    gateway_factory: Any,
) -> None:
    echo = {"processor": "python", "entry": ECHO_ENTRY, "workers": 1}
    gw: GatewayProcess = gateway_factory({
        "admin": {"host": "127.0.0.1", "port": 0, "token": ADMIN_TOKEN},
        "services": [{"name": "echo", **echo}, {"name": "gone", **echo}],
    })  # fmt: skip
    gw.wait_workers_ready("echo", 1)
    gw.wait_workers_ready("gone", 1)
    before = _frozen(gw)
    # A gateway's modules and state alone are tens of thousands of objects.
    assert before > 10_000
    status, _ = http(
        admin_url(gw) + "/admin/services/gone",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        method="DELETE",
    )
    assert status == 200
    # Thawed when the service stopped, frozen again once the change was over: what is
    # frozen now is counted anew, without what the deleted service held.
    after = wait_until(lambda: (n := _frozen(gw)) != before and n, 30, "the heap frozen again")
    assert after > 10_000
    req = urllib.request.Request(gw.url + "/api/predict/echo", data=b"still here", method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.read() == b"still here"
