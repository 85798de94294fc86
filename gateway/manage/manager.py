"""The service manager: services created, updated, scaled and deleted while the gateway runs.

Every change goes through one lock and ends in one swap of the application's service set
(the dataplane's services, the backends, the Config every route reads, the lean front's path
table), so a call finds either the old version or the new one, never half of each:

* create: start the pool, then publish the service (its calls get 503 with the reason
  until a worker is ready, as any service's do);
* update: a change of worker count, timeout or pending limit applies in place; any other
  change rolls: a new pool starts beside the old one, and only once all its workers are
  ready is it swapped in, after which the old pool drains (its calls finish) and stops.
  A new version that does not start is stopped and reported (422); the old keeps serving;
* scale: workers added, or the last ones drained and stopped, the others serving on;
* delete: unpublished at once (404 from then on), then drained and stopped.

Changes made through the API persist in the data directory (gateway.manage.store);
``reload`` applies a new config file the same way without persisting it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.config import (
    Config,
    ConfigError,
    GatewayConfig,
    ServiceConfig,
    check_model_dirs,
    source_prefixes,
)
from gateway.config.traffic import Traffic, parse_traffic, traffic_doc
from gateway.config.versions import version_services
from gateway.core import errors
from gateway.core.backend import ServiceBackend
from gateway.core.dataplane import DataPlane
from gateway.core.heap import refreeze, thaw
from gateway.core.services import GatewayState, service_ready
from gateway.manage.canary import Canary, parse_plan
from gateway.manage.rollout import Rollout
from gateway.manage.spec import IN_PLACE_FIELDS, ROUTING_FIELDS, changed_fields, parse_spec, spec_of
from gateway.manage.store import ManagedStore
from gateway.observability.metrics import GatewayMetrics
from gateway.queue.interfaces import QueueService

# After a service stopped, how long before the heap is frozen again: the change that
# stopped it is over by then, so nothing refers to what it held.
REFREEZE_AFTER_S = 2.0

log = logging.getLogger("gateway.manage")

PoolFactory = Callable[[ServiceConfig, Any], ServiceBackend]


@dataclass(eq=False)
class GatewayParts:
    """The composition root: the live objects a running gateway serves from, made once by
    ``gateway.app.create_app`` and handed to every front. The manager changes them in place
    (the config's services, the backends, the dataplane's table), so a change is seen by
    the next call whichever front it arrives on."""

    config: Config
    dataplane: DataPlane
    # Service name -> its backend (worker pool, thread service, pipeline, older version).
    backends: dict[str, ServiceBackend]
    queues: QueueService | None  # None when no queue or asynchronous service is configured
    metrics: GatewayMetrics
    state: GatewayState
    # Set right after: the manager is made from the parts it changes.
    manager: ServiceManager = field(init=False)


class ServiceManager:
    def __init__(self, gw: GatewayParts, make_pool: PoolFactory, store: ManagedStore | None = None) -> None:
        self.gw = gw
        self.make_pool = make_pool
        self.store = store
        self.lock = asyncio.Lock()
        # Models unloaded through the Triton repository API, kept to be loaded again.
        self.unloaded: dict[str, ServiceConfig] = {}
        # Every backend this manager started and has not stopped yet (published or still
        # starting beside an old version): the application stops them all at shutdown.
        self.started: list[ServiceBackend] = []
        # Rolls under way, by service: their new workers are not published until the swap.
        self.rollouts: dict[str, Rollout] = {}
        # The service groups the file names (a reload changes them, as it changes services).
        gw.dataplane.groups = dict(gw.config.groups)
        # Each service's canary under way, or its last one (gateway.manage.canary).
        self.canaries: dict[str, Canary] = {}
        self._canary_tasks: dict[str, asyncio.Task[None]] = {}
        # Service -> the workers its load asks for, kept by the autoscaler (gateway.manage.autoscale).
        self.desired_workers: dict[str, int] = {}
        # The start-up heap's refreeze after a service stopped (gateway.core.heap), pending.
        self._refreeze: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ reading
    @property
    def config(self) -> Config:
        return self.gw.config

    def service(self, name: str) -> ServiceConfig:
        svc = self.gw.dataplane.services.get(name)
        if svc is None:
            raise errors.ServiceNotFound(f"service {name!r} not found")
        return svc

    def describe(self, name: str) -> dict[str, Any]:
        """The service's description (tokens hidden) and its live state."""
        svc = self.service(name)
        gw = self.gw
        pool = gw.backends.get(name)
        ready = service_ready(gw.backends, gw.state, gw.queues is not None, name)
        out: dict[str, Any] = {"name": name, "spec": spec_of(svc), "ready": ready}
        out["managed"] = self.store is not None and name in self.store.overlay
        if svc.processor not in ("queue", "pipeline"):
            out["placement"] = svc.placement
            if svc.placement_reason:
                out["placement_reason"] = svc.placement_reason
        if pool is not None:
            reason = None if ready else pool.not_ready_reason()
            if reason:
                out["reason"] = reason
            out["workers"] = pool.snapshot()
            out["restarts"] = pool.restarts_total
            out["in_flight"] = pool.pending
            # Calls waiting behind the one each worker runs.
            out["queue_depth"] = sum(max(0, w["outstanding"] - 1) for w in out["workers"])
        if name in self.desired_workers:
            out["desired_workers"] = self.desired_workers[name]
        rollout = self.rollouts.get(name)
        if rollout is not None:
            out["rollout"] = rollout.view()
        canary = self.canaries.get(name)
        if canary is not None:
            out["canary"] = canary.view()
        if self.store is not None and self.store.history.get(name):
            out["history"] = self.store.history[name][-10:]
        qm = gw.queues
        if qm is not None and (svc.processor == "queue" or svc.async_):
            queue = qm.snapshot().get("queues", {}).get(name)
            if isinstance(queue, dict):
                out["queue_depth"] = queue.get("length")  # records waiting in the input queue
        count, seconds = gw.metrics.totals(name)
        out["requests"] = count
        out["latency_sum_s"] = round(seconds, 6)
        return out

    def list(self) -> list[dict[str, Any]]:
        return [self.describe(s.name) for s in self.config.services]

    # ------------------------------------------------------------------ changes (API)
    async def create(self, raw: Any) -> dict[str, Any]:
        svc = _parse(raw, self.config.gateway)
        async with self.lock:
            if svc.name in self.gw.dataplane.services:
                raise errors.Conflict(f"service {svc.name!r} already exists; update it instead")
            await self._create(svc)
            self._store().put(svc)
        return self.describe(svc.name)

    async def update(self, name: str, raw: Any) -> dict[str, Any]:
        svc = _parse(raw, self.config.gateway)
        if svc.name != name:
            raise errors.BadRequest(f"the description names service {svc.name!r}, not {name!r}")
        async with self.lock:
            old = self.service(name)
            _refuse_queue(old)
            await self._update(old, svc)
            self._store().put(svc)
        return self.describe(name)

    async def scale(self, name: str, workers: Any) -> dict[str, Any]:
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 64:
            raise errors.BadRequest(f"workers: expected an integer from 1 to 64, got {workers!r}")
        async with self.lock:
            old = self.service(name)
            if old.processor in ("queue", "pipeline"):
                raise errors.BadRequest(f"service {name!r} is a {old.processor} service: it has no workers")
            if old.placement == "thread" and old.placement_reason:
                # Scaling is what worker processes are for; the sessions of a service that asked
                # for none are not scaled behind its back.
                raise errors.BadRequest(
                    f"service {name!r} runs in the gateway's threads ({old.placement_reason}): "
                    "it has no worker processes to scale; to scale it at runtime, update it with "
                    "placement: process"
                )
            new = replace(old, workers=workers)
            await self._update(old, new)
            self._store().put(new)
        return self.describe(name)

    async def set_traffic(self, name: str, raw: Any) -> dict[str, Any]:
        """A new traffic split between the service's versions, applied in place: every
        version's pool serves on, so no call is dropped; a refused split leaves the running
        one as it was."""
        async with self.lock:
            old = self.service(name)
            try:
                traffic = parse_traffic(raw, old.version_names if old.versions else (), "traffic")
            except ConfigError as exc:
                raise errors.BadRequest(str(exc)) from None
            new = replace(old, traffic=traffic)
            await self._update(old, new)
            self._store().put(new)
        return self.describe(name)

    # ------------------------------------------------------------------ canaries
    async def canary(self, name: str, raw: Any) -> dict[str, Any]:
        """Start moving the service's calls to a new version (gateway.manage.canary); returns
        at once, the canary's progress in the service's description."""
        async with self.lock:
            svc = self.service(name)
            running = self.canaries.get(name)
            if running is not None and not running.done:
                raise errors.Conflict(
                    f"service {name!r} has a canary of version {running.plan.version} under way; "
                    "abort it first"
                )
            try:
                plan, old = parse_plan(raw, svc)
            except ConfigError as exc:
                raise errors.BadRequest(str(exc)) from None

            async def apply(traffic: Traffic, keep: bool) -> None:
                await self._set_split(name, traffic, keep)

            canary = Canary(name, old, plan, svc.traffic, self.gw.metrics.versions, apply)
            self.canaries[name] = canary
            self._canary_tasks[name] = asyncio.create_task(self._run_canary(canary))
            log.info(
                "service %s: canary of version %s from %s, steps %s", name, plan.version, old, plan.steps
            )
        return self.describe(name)

    async def abort_canary(self, name: str) -> dict[str, Any]:
        """Stop the service's canary under way and put its split back as it was."""
        self.service(name)
        canary, task = self.canaries.get(name), self._canary_tasks.get(name)
        if canary is None or canary.done or task is None:
            raise errors.Conflict(f"service {name!r} has no canary under way")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return self.describe(name)

    async def _run_canary(self, canary: Canary) -> None:
        try:
            await canary.run()
        except asyncio.CancelledError:
            if not self.gw.state.shutting_down:
                await canary.apply(canary.original, False)
            self._record(canary)
            raise
        except Exception as exc:  # the service went away or changed under it: reported, never raised
            canary.phase, canary.reason = "failed", str(exc)
            if not self.gw.state.shutting_down:
                with contextlib.suppress(Exception):
                    await canary.apply(canary.original, False)
        self._record(canary)

    def _record(self, canary: Canary) -> None:
        log.log(
            logging.INFO if canary.phase == "promoted" else logging.WARNING,
            "service %s: canary of version %s %s%s", canary.service, canary.plan.version, canary.phase,
            f": {canary.reason}" if canary.reason else "",
        )  # fmt: skip
        self._store().record(canary.service, canary.event())

    async def _set_split(self, name: str, traffic: Traffic, keep: bool) -> None:
        async with self.lock:
            old = self.service(name)
            new = replace(old, traffic=traffic)
            await self._update(old, new)
            if keep:
                self._store().put(new)

    async def delete(self, name: str) -> None:
        async with self.lock:
            _refuse_queue(self.service(name))
            await self._delete(name)
            self._store().delete(name)

    # ------------------------------------------------------------------ model control (Triton)
    async def load(self, name: str) -> None:
        """Load an unloaded model again, or roll a loaded one (its model file re-read)."""
        async with self.lock:
            current = self.gw.dataplane.services.get(name)
            if current is not None:
                _refuse_queue(current)
                await self._roll(current, current)
            elif name in self.unloaded:
                await self._create(self.unloaded[name])
                del self.unloaded[name]
            else:
                raise errors.ServiceNotFound(f"model {name!r} not found")

    async def unload(self, name: str) -> None:
        async with self.lock:
            svc = self.service(name)
            _refuse_queue(svc)
            await self._delete(name)
            self.unloaded[name] = svc

    # ------------------------------------------------------------------ reload (config file)
    async def reload(self, new: Config) -> dict[str, list[str]]:
        """Apply a new config file's services (the API's changes stay on top): added ones
        start, changed ones update (rolling), removed ones drain and stop."""
        async with self.lock:
            wanted = self._store().apply(new.services) if self.store is not None else new.services
            # The services the file names; an older model version's is its service's to manage.
            current = {n: s for n, s in self.gw.dataplane.services.items() if "@" not in n}
            done: dict[str, list[str]] = {"added": [], "changed": [], "removed": [], "failed": []}
            for svc in wanted:
                old = current.get(svc.name)
                try:
                    if old is None:
                        _refuse_queue(svc)
                        await self._create(svc)
                        done["added"].append(svc.name)
                    elif old != svc:
                        _refuse_queue(old)
                        _refuse_queue(svc)
                        await self._update(old, svc)
                        done["changed"].append(svc.name)
                except errors.GatewayError as exc:
                    log.error("reload: service %s not applied: %s", svc.name, exc.message)
                    done["failed"].append(svc.name)
            # Groups follow the file once its services are in place; a group whose members
            # did not all come is still resolved, its missing member's calls a 404.
            self.gw.dataplane.groups = dict(new.groups)
            names = {s.name for s in wanted}
            for name, old in current.items():
                if name in names:
                    continue
                if old.processor == "queue" or old.async_:
                    log.error("reload: queue service %s stays until a restart", name)
                    done["failed"].append(name)
                    continue
                await self._delete(name)
                done["removed"].append(name)
            return done

    # ------------------------------------------------------------------ the mechanics
    def _store(self) -> ManagedStore:
        if self.store is None:
            self.store = ManagedStore(self.config.gateway.data_dir)
            self.store.load()
        return self.store

    async def _start(self, svc: ServiceConfig) -> ServiceBackend:
        pool = self.make_pool(svc, self.config.gateway)
        self.started.append(pool)
        await pool.start()
        return pool

    async def _stop(self, pool: ServiceBackend, drain_timeout: float) -> None:
        await pool.stop(drain_timeout)
        if pool in self.started:
            self.started.remove(pool)
        # What the stopped service held may be cycles the start-up's freeze hides from the
        # collector: thaw now, refreeze once the change is over and nothing refers to it.
        thaw()
        if self._refreeze is not None:
            self._refreeze.cancel()
        self._refreeze = asyncio.get_running_loop().call_later(REFREEZE_AFTER_S, refreeze)

    async def _start_all(self, svc: ServiceConfig) -> dict[str, ServiceBackend]:
        """Pools for the service and for each of its older model versions (gateway.config.versions)."""
        return {s.name: await self._start(s) for s in (svc, *_older(svc))}

    async def _create(self, svc: ServiceConfig) -> None:
        pools = await self._start_all(svc)
        self._publish(svc, pools)
        log.info("service %s created (%d worker(s))", svc.name, svc.workers)
        # Bounded: a model that does not load is reported by the service's state, not here.
        timeout = self.config.gateway.worker_start_timeout_s
        await asyncio.gather(*(p.wait_ready(timeout) for p in pools.values()))

    async def _update(self, old: ServiceConfig, new: ServiceConfig) -> None:
        changed = changed_fields(old, new)
        if not changed:
            return
        if changed <= ROUTING_FIELDS:  # the same pools, calls split another way
            self._publish(new, {s.name: self.gw.backends[s.name] for s in (new, *_older(new))})
            log.info(
                "service %s: traffic %s", new.name, traffic_doc(new.traffic) or "all to the latest version"
            )
            return
        if changed <= IN_PLACE_FIELDS and not old.versions and not new.versions:
            pool = self.gw.backends[old.name]
            pool.service = new  # the pending limit and the pool's view of the service
            self._publish(new, {new.name: pool})
            if "workers" in changed:
                t0 = time.monotonic()
                await pool.scale(new.workers, self.config.gateway.shutdown_timeout_s)
                if new.workers > old.workers:
                    await pool.wait_all_ready(self.config.gateway.worker_start_timeout_s)
                log.info(
                    "service %s scaled from %d to %d worker(s) in %.1f s",
                    new.name, old.workers, new.workers, time.monotonic() - t0,
                )  # fmt: skip
            return
        await self._roll(old, new)

    async def _roll(self, old: ServiceConfig, new: ServiceConfig) -> None:
        rollout = Rollout(new.workers, [self.gw.backends.get(old.name)])
        self.rollouts[new.name] = rollout
        try:
            await self._roll_through(old, new, rollout)
        finally:
            self.rollouts.pop(new.name, None)

    async def _roll_through(self, old: ServiceConfig, new: ServiceConfig, rollout: Rollout) -> None:
        gw = self.config.gateway
        t0 = time.monotonic()
        pools = await self._start_all(new)
        rollout.new = [pools[new.name]]
        for pool in pools.values():
            if not await pool.wait_all_ready(gw.worker_start_timeout_s):
                reason = pool.not_ready_reason() or f"not ready within {gw.worker_start_timeout_s:g} s"
                await asyncio.gather(*(self._stop(p, 0.0) for p in pools.values()))
                raise _rollout_failed(new.name, reason)
        previous = self._unpublish_older(old)
        previous.append(self.gw.backends.get(old.name))
        self._publish(new, pools)
        rollout.old, rollout.phase = previous, "draining"
        # The old pools drain: calls already sent finish there.
        await asyncio.gather(*(self._stop(p, gw.shutdown_timeout_s) for p in previous if p is not None))
        log.info("service %s rolled to its new version in %.1f s", new.name, time.monotonic() - t0)

    async def _delete(self, name: str) -> None:
        old = self.gw.dataplane.services.get(name)
        pools = self._unpublish_older(old) if old is not None else []
        pools.append(self.gw.backends.get(name))
        self._unpublish(name)
        gw = self.config.gateway
        await asyncio.gather(*(self._stop(p, gw.shutdown_timeout_s) for p in pools if p is not None))
        log.info("service %s deleted", name)

    def _publish(self, svc: ServiceConfig, pools: dict[str, ServiceBackend]) -> None:
        """Serve ``svc`` (and its older versions, reachable only through the V2 version routes)
        from ``pools``; one synchronous step, so a call sees the old set or the new one."""
        gw = self.gw
        for older in _older(svc):
            gw.backends[older.name] = pools[older.name]
            gw.dataplane.set_service(older)
        gw.backends[svc.name] = pools[svc.name]
        gw.dataplane.set_service(svc)
        gw.metrics.add_service(svc.name)
        services = [s for s in self.config.services if s.name != svc.name]
        index = next((i for i, s in enumerate(self.config.services) if s.name == svc.name), len(services))
        services.insert(index, svc)
        self.config.set_services(tuple(services))
        self._changed()

    def _unpublish_older(self, svc: ServiceConfig) -> list[ServiceBackend | None]:
        """Stop serving the older versions of ``svc``; -> their pools, to be stopped."""
        out: list[ServiceBackend | None] = []
        for older in _older(svc):
            self.gw.dataplane.remove_service(older.name)
            out.append(self.gw.backends.pop(older.name, None))
        return out

    def _unpublish(self, name: str) -> None:
        gw = self.gw
        gw.dataplane.remove_service(name)
        gw.backends.pop(name, None)
        self.config.set_services(tuple(s for s in self.config.services if s.name != name))
        self._changed()

    def _changed(self) -> None:
        for callback in self.gw.state.on_services_changed:
            callback()


def _rollout_failed(name: str, reason: str) -> errors.RolloutFailed:
    log.error("service %s: the new version did not start (%s); the old one serves on", name, reason)
    return errors.RolloutFailed(
        f"the new version of service {name} did not start: {reason}; the running one serves on"
    )


def _older(svc: ServiceConfig) -> list[ServiceConfig]:
    """The services behind the older model versions of ``svc`` (none without versions)."""
    return [v for v in version_services(svc).values() if v is not svc]


def _parse(raw: Any, gw: GatewayConfig) -> ServiceConfig:
    try:
        svc = parse_spec(raw)
        check_model_dirs(svc, gw.model_dirs, f"service ({svc.name})", source_prefixes(gw))
    except ConfigError as exc:
        raise errors.BadRequest(str(exc)) from None
    return svc


def _refuse_queue(svc: ServiceConfig) -> None:
    if svc.processor in ("queue", "pipeline") or svc.async_:
        raise errors.BadRequest(
            f"service {svc.name!r} is a queue, asynchronous or pipeline service: the config file manages it"
        )


__all__ = ["GatewayParts", "ServiceManager"]
