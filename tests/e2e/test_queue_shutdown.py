"""SIGTERM is not held up by open queue streams: watches close and long polls answer at once."""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

from eas_sdk import QueueClient
from tests.waiting import wait_until


def _inflight(url: str) -> float:
    """The gateway's count of requests being handled (its /metrics)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return float(next(ln for ln in text.splitlines() if ln.startswith("easgw_inflight_requests ")).split()[1])


def test_sigterm_with_open_watch_and_long_poll_stops_promptly(gateway_factory: Any) -> None:
    gw = gateway_factory(
        {
            "gateway": {"shutdown_timeout_s": 20},
            "services": [{"name": "jobs", "processor": "queue", "token": "tok-1234567890"}],
        }
    )
    watcher_client = QueueClient(gw.url, "jobs")
    watcher_client.set_token("tok-1234567890")
    watcher_client.init(uid="watcher")
    poller = QueueClient(gw.url, "jobs")
    poller.set_token("tok-1234567890")
    poller.init(uid="poller")
    index, _ = watcher_client.put(b"first")
    watcher = watcher_client.watch(0, 4)
    stream = watcher.run()
    first = next(stream)
    assert first.data == b"first" and first.index == int(index)

    before = _inflight(gw.url)
    poll_result: list[Any] = []
    poll = threading.Thread(
        target=lambda: poll_result.append(poller.get(index=0, timeout="15s", tags={"x": "y"}))
    )
    poll.start()
    wait_until(lambda: _inflight(gw.url) > before, 10, "the long poll parked on the server")

    started = time.monotonic()
    rc = gw.stop(timeout=15)
    elapsed = time.monotonic() - started
    watcher.close()
    poll.join(10)
    watcher_client.close()
    poller.close()
    assert rc == 0, gw.output()[-3000:]
    # The shutdown timeout is 20 s; open streams must not hold the gateway that long (it
    # takes well under a second: half the timeout is slack for a loaded machine).
    assert elapsed < 10, f"SIGTERM took {elapsed:.1f}s with an open watch and a long poll"
    assert not poll.is_alive()
