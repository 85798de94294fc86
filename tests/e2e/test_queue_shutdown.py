"""SIGTERM is not held up by open queue streams: watches close and long polls answer at once."""

from __future__ import annotations

import threading
import time
from typing import Any

from eas_sdk import QueueClient


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

    poll_result: list[Any] = []
    poll = threading.Thread(
        target=lambda: poll_result.append(poller.get(index=0, timeout="15s", tags={"x": "y"}))
    )
    poll.start()
    time.sleep(0.3)  # the long poll is now parked on the server

    started = time.monotonic()
    rc = gw.stop(timeout=15)
    elapsed = time.monotonic() - started
    watcher.close()
    poll.join(10)
    watcher_client.close()
    poller.close()
    assert rc == 0, gw.output()[-3000:]
    # The shutdown timeout is 20 s; open streams must not hold the gateway that long.
    assert elapsed < 10, f"SIGTERM took {elapsed:.1f}s with an open watch and a long poll"
    assert not poll.is_alive()
