"""The scheduling policy a worker puts itself under: every thread's, those already running (a
library's, started when imported) and those started afterwards (the compute thread, the
runtime's threads). Each case runs in a child process, so the test process keeps its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gateway.worker import scheduling

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")

CHILD = """
import json, sys, threading
from pathlib import Path
from gateway.worker import scheduling

def policy():
    stat = Path(f"/proc/self/task/{threading.get_native_id()}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[38])  # field 41, the policy

def report(into):
    into.append(policy())

stop, early = threading.Event(), []
before = threading.Thread(target=lambda: (stop.wait(), report(early)))
before.start()  # running before the policy is applied, as a library's pool is
applied = scheduling.apply(sys.argv[1])
later = []
t = threading.Thread(target=report, args=(later,))
t.start(); t.join()
stop.set(); before.join()
print(json.dumps({"applied": applied, "main": policy(), "before": early[0], "later": later[0]}))
"""


def _run(policy: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, policy], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_batch_covers_running_threads_and_later_ones() -> None:
    b = os.SCHED_BATCH
    assert _run("batch") == {"applied": True, "main": b, "before": b, "later": b}


def test_normal_leaves_threads_as_any_process() -> None:
    n = os.SCHED_OTHER
    assert _run("normal") == {"applied": True, "main": n, "before": n, "later": n}


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="batch"):
        scheduling.apply("fifo")
