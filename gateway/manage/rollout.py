"""A rolling update as it happens, for the admin API's live state (``rollout`` in a service's
description) and so for ``eas-gateway services update``'s progress lines.

A roll starts the new version's pools beside the old ones (``starting``: the old workers
serve), swaps them in once every new worker is ready, then lets the old pools finish what
they hold and stop (``draining``). The new pools are not published until the swap, so this
record is the only place their workers can be seen before it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.core.backend import ServiceBackend


@dataclass
class Rollout:
    workers: int  # the new version's worker count
    old: list[ServiceBackend | None]  # the pools serving (starting) or draining (draining)
    new: list[ServiceBackend] = field(default_factory=list)  # the new version's pools, once started
    phase: str = "starting"
    started_at: float = field(default_factory=time.monotonic)

    def view(self) -> dict[str, Any]:
        """``phase``, the new workers (how many, how many ready), the old ones (how many,
        calls they still hold) and the seconds since the roll began."""
        new = [w for pool in self.new for w in pool.snapshot()]
        old = [w for pool in self.old if pool is not None for w in pool.snapshot() if w["state"] != "stopped"]
        return {
            "phase": self.phase,
            "new_workers": max(len(new), self.workers),
            "new_ready": sum(1 for w in new if w["state"] == "ready"),
            "old_workers": len(old),
            "old_in_flight": sum(int(pool.pending) for pool in self.old if pool is not None),
            "elapsed_s": round(time.monotonic() - self.started_at, 1),
        }


__all__ = ["Rollout"]
