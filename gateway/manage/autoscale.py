"""The autoscaler: each autoscaled service's worker count follows its load.

Twice a second it reads each service with ``autoscale:`` (gateway.config.autoscale): its
load is the calls its backend holds (``ServiceBackend.pending``) plus, for an asynchronous
service, the records waiting in its input queue. The workers it wants are
``ceil(load / target)`` within the bounds in force (the service's own, or the schedule
entry that fired last), and the largest such need over the last ``scale_down_after_s``: so
it scales up on the next tick and down only once the load has stayed lower for the whole
window. With ``min_workers: 0`` it keeps one worker until no call has come for
``idle_after_s``, then none (the pool starts one again on the next call).

It scales through ``ServiceBackend.scale`` under the service manager's lock, so an admin
change and a scaling step never interleave, and never while a service rolls to a new version.
The workers it wants are published as ``easgw_desired_workers{service}``, which a Kubernetes
HPA or KEDA follows for workers it runs (``deploy/``); a service served by remote workers
only (``workers: 0``) is published, not scaled.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.config import ServiceConfig
from gateway.core.backend import ServiceBackend
from gateway.manage.manager import ServiceManager

log = logging.getLogger("gateway.autoscale")

INTERVAL_S = 0.5
# Worker states that are on their way out: not counted as running.
_LEAVING = ("draining", "stopped")


@dataclass
class _Track:
    """One service's recent needs."""

    busy_at: float  # when it last had a call (its start counts as one)
    needs: deque[tuple[float, int]] = field(default_factory=deque)


class Autoscaler:
    """See the module docstring; ``start`` and ``stop`` bracket the gateway's serving."""

    def __init__(
        self,
        manager: ServiceManager,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.manager = manager
        self.clock = clock
        self.wall = wall
        # Service -> the workers it wants now: the gauge, and the service's description.
        self.desired = manager.desired_workers
        self._tracks: dict[str, _Track] = {}
        self._scaling: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        manager.gw.metrics.registry.register(_DesiredCollector(self.desired))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="autoscaler")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._scaling.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                self.tick()
            except Exception:  # a bad tick must not end autoscaling for every service
                log.exception("autoscaling tick failed")
            await asyncio.sleep(INTERVAL_S)

    # ------------------------------------------------------------------ deciding
    def tick(self) -> None:
        """Decide every autoscaled service's workers and start the steps that are due."""
        gw = self.manager.gw
        now, wall = self.clock(), self.wall()
        services = [s for s in gw.config.services if s.autoscale is not None]
        for name in set(self.desired) - {s.name for s in services}:
            self.desired.pop(name, None)
            self._tracks.pop(name, None)
        for svc in services:
            backend = gw.backends.get(svc.name)
            if backend is None:
                continue
            want = self.decide(svc, backend, now, wall)
            self.desired[svc.name] = want
            if svc.workers == 0 and svc.remote_workers is not None:
                continue  # remote workers only: an HPA or KEDA follows the gauge
            running = _running(backend)
            busy = self._scaling.get(svc.name)
            if want != running and (busy is None or busy.done()) and svc.name not in self.manager.rollouts:
                self._scaling[svc.name] = asyncio.create_task(self._scale(svc.name, backend, running, want))

    def decide(self, svc: ServiceConfig, backend: ServiceBackend, now: float, wall: dt.datetime) -> int:
        auto = svc.autoscale
        assert auto is not None
        lo, hi = auto.bounds_at(wall)
        load = self._load(svc, backend)
        track = self._tracks.setdefault(svc.name, _Track(busy_at=now))
        if load or not backend.is_ready():  # idle counts from its last call, once it is up
            track.busy_at = now
        need = min(hi, max(lo, math.ceil(load / auto.target)))
        track.needs.append((now, need))
        while track.needs and track.needs[0][0] < now - auto.scale_down_after_s:
            track.needs.popleft()
        want = min(hi, max(lo, *(n for _, n in track.needs)))
        if want == 0 and now - track.busy_at < auto.idle_after_s:
            want = 1  # idle, but not for long enough to stop the last worker
        return want

    def _load(self, svc: ServiceConfig, backend: ServiceBackend) -> int:
        load = backend.pending
        queues = self.manager.gw.queues
        if svc.async_ and queues is not None:
            queue = queues.snapshot().get("queues", {}).get(svc.name)
            if isinstance(queue, dict):
                load += int(queue.get("length") or 0)
        return load

    # ------------------------------------------------------------------ acting
    async def _scale(self, name: str, backend: ServiceBackend, running: int, want: int) -> None:
        manager = self.manager
        async with manager.lock:
            # Changed or removed while this step waited for the lock: the next tick decides again.
            if manager.gw.backends.get(name) is not backend or name in manager.rollouts:
                return
            log.info(
                "service %s: autoscaling from %d to %d worker(s) (load %d)",
                name,
                running,
                want,
                backend.pending,
            )
            try:
                await backend.scale(want, manager.config.gateway.shutdown_timeout_s)
            except Exception:  # reported; the next tick tries again
                log.exception("service %s: autoscaling to %d worker(s) failed", name, want)


def _running(backend: ServiceBackend) -> int:
    """The backend's own workers, starting or serving, that are not leaving."""
    return sum(1 for w in backend.snapshot() if not w.get("remote") and w.get("state") not in _LEAVING)


class _DesiredCollector(Collector):
    def __init__(self, desired: dict[str, int]) -> None:
        self.desired = desired

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "easgw_desired_workers",
            "Workers the autoscaler wants for the service (an HPA or KEDA follows it for remote workers)",
            labels=["service"],
        )
        for name, n in sorted(self.desired.items()):
            gauge.add_metric([name], n)
        yield gauge


__all__ = ["INTERVAL_S", "Autoscaler"]
