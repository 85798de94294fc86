"""A ready gateway has frozen its start-up's objects out of the garbage collector's full
scans (what keeps those scans, which stop every call, to milliseconds), and says so in
``/metrics`` beside the collector's own figures."""

from __future__ import annotations

import re
import urllib.request
from typing import Any

from tests.e2e.gateway_proc import ECHO_ENTRY, GatewayProcess


def _metrics(gw: GatewayProcess) -> str:
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as resp:
        return resp.read().decode()


def test_the_ready_gateway_has_frozen_its_start_up_objects(gateway_factory: Any) -> None:
    gw: GatewayProcess = gateway_factory(
        {"services": [{"name": "echo", "processor": "python", "entry": ECHO_ENTRY, "workers": 1}]}
    )
    gw.wait_workers_ready("echo", 1)
    text = _metrics(gw)
    (frozen,) = re.findall(r"^python_gc_frozen_objects (\S+)$", text, re.M)
    # A gateway's modules and state alone are tens of thousands of objects.
    assert float(frozen) > 10_000
    assert re.search(r'^python_gc_collections_total\{generation="2"\} \S+$', text, re.M)
