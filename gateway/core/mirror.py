"""Mirroring: a share of a service's calls copied to its mirror (another version of its model
or another service, gateway.config.mirror), the copies' answers discarded.

The copy leaves once the call is dispatched and runs on its own: the caller never waits for
it, and the copy's errors and time are told to the observer apart from the service's own
(``easgw_mirror_*``). At most ``max_in_flight`` copies of a service's calls run at once; past
that a copy is shed, counted and never queued, so a slow or failing mirror costs the
service nothing but the copies it drops.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import replace

from gateway.config import ServiceConfig
from gateway.config.versions import version_key
from gateway.core import errors
from gateway.core.backend import Backend
from gateway.core.calls import WorkerRequest
from gateway.core.observers import DispatchObserver

log = logging.getLogger("gateway.dataplane")

SHED = "shed"


class Mirrors:
    """The copies under way, per service (see the module docstring)."""

    def __init__(self, backends: Mapping[str, Backend], observer: DispatchObserver | None) -> None:
        self.backends = backends
        self.observer = observer
        self.in_flight: dict[str, int] = {}
        # Held until each copy ends: a task nobody refers to may be collected mid-run.
        self._tasks: set[asyncio.Task[None]] = set()

    def copy(self, svc: ServiceConfig, req: WorkerRequest) -> None:
        """Maybe send a copy of ``req`` (a call of ``svc``, which has a mirror) to the mirror."""
        mirror = svc.mirror
        assert mirror is not None
        # Not a secret: a fair draw is all the share needs.
        if mirror.percent < 100.0 and random.random() * 100.0 >= mirror.percent:
            return
        name = svc.name.partition("@")[0]  # an older version's calls are the service's too
        if mirror.version is not None:
            # An older version is served apart, under its own key; the latest by the service.
            label = version_key(name, mirror.version)
            target = label if label in self.backends else name
        else:
            target = label = mirror.service or ""
        running = self.in_flight.get(name, 0)
        if running >= mirror.max_in_flight:
            self._tell(name, label, SHED, 0.0, running)
            return
        backend = self.backends.get(target)
        if backend is None:
            self._tell(name, label, "404", 0.0, running)
            return
        self.in_flight[name] = running + 1
        self._tell(name, label, None, 0.0, running + 1)
        # The backend's own timeout for it, whatever was left of the caller's budget.
        copy = replace(req, deadline=time.monotonic() + svc.timeout_ms / 1000.0)
        task = asyncio.get_running_loop().create_task(
            self._run(name, label, backend, copy, svc.timeout_ms / 1000.0)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, name: str, label: str, backend: Backend, req: WorkerRequest, timeout: float) -> None:
        t0 = time.perf_counter()
        try:
            resp = await backend.dispatch(req, timeout)
            outcome = str(int(resp.status))
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception as exc:  # the copy's failure is the mirror's, never the caller's
            outcome = str(errors.from_exception(exc).status)
        finally:
            self.in_flight[name] -= 1
            self._tell(name, label, outcome, time.perf_counter() - t0, self.in_flight[name])

    def _tell(self, name: str, label: str, outcome: str | None, seconds: float, in_flight: int) -> None:
        if self.observer is not None:
            self.observer.observe_mirror(name, label, outcome, seconds, in_flight)


__all__ = ["SHED", "Mirrors"]
