"""A service change shown as it happens: ``eas-gateway services create|update|scale``.

The admin API answers a change once it is done (the workers ready, a roll swapped in and the
old version drained) or has failed. While the call runs, the CLI reads the service's live
state every ``POLL_S`` and prints a line to stderr each time it changes:

    service digits: rolling out: 1/2 new workers ready, 1 old serving (1.2 s)
    service digits: rolling out: 2/2 new workers ready, 1 old draining, 3 calls in flight (2.0 s)
    service digits: scaling: 2/3 workers ready, 1 starting (0.8 s)

A change that is over before the first look prints nothing more than its result.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TextIO

POLL_S = 0.25


def progress_line(doc: dict[str, Any]) -> str | None:
    """What a service's live state (the admin API's description) says of a change under way."""
    rollout = doc.get("rollout")
    if isinstance(rollout, dict):
        head = f"rolling out: {rollout['new_ready']}/{rollout['new_workers']} new workers ready"
        if rollout["phase"] == "starting":
            return f"{head}, {rollout['old_workers']} old serving"
        in_flight = rollout["old_in_flight"]
        calls = f", {in_flight} call{'s' if in_flight != 1 else ''} in flight" if in_flight else ""
        return f"{head}, {rollout['old_workers']} old draining{calls}"
    workers = doc.get("workers")
    if not isinstance(workers, list):
        return None
    states = Counter(str(w.get("state")) for w in workers)
    ready = states.pop("ready", 0)
    states.pop("stopped", None)
    if not states:
        return None  # every worker ready: nothing under way (the result says the rest)
    serving = ready + sum(n for state, n in states.items() if state != "draining")
    others = "".join(f", {n} {state}" for state, n in sorted(states.items()))
    return f"{ready}/{serving} workers ready{others}"


def with_progress(
    name: str,
    what: str,
    call: Callable[[], Any],
    look: Callable[[], Any],
    out: TextIO,
    poll_s: float = POLL_S,
) -> Any:
    """``call()``'s answer (or its exception), printing ``look()``'s progress lines meanwhile."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["doc"] = call()
        except BaseException as exc:  # handed to the caller's thread below
            result["error"] = exc

    worker = threading.Thread(target=run, name=f"admin-{what}", daemon=True)
    t0 = time.monotonic()
    worker.start()
    last = None
    while True:
        worker.join(poll_s)
        if not worker.is_alive():
            break
        try:
            doc = look()
        except Exception:  # noqa: S112 - not there yet (create), or a lost look: the call decides
            continue
        line = progress_line(doc) if isinstance(doc, dict) else None
        if line and line != last:
            label = "" if line.startswith("rolling out") else f"{what}: "
            print(f"service {name}: {label}{line} ({time.monotonic() - t0:.1f} s)", file=out, flush=True)
            last = line
    if "error" in result:
        raise result["error"]
    return result["doc"]


__all__ = ["POLL_S", "progress_line", "with_progress"]
