"""Every kind of service backend, and every test double standing in for one, implements its
contract in full: each member of ``ServiceBackend`` (gateway.core.backend) is there, a method
as a method with the Protocol's parameter names (async where the Protocol's is), a value as a
value. The same for the queue manager and its double against what the application and the
dispatchers use of it. So no caller ever has to ask whether a member is there."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, Generic, Protocol

import pytest

from gateway.backends.pipelines.backend import PipelineBackend
from gateway.backends.pool import WorkerPool
from gateway.backends.sourced import SourcedBackend
from gateway.backends.threads import ThreadService
from gateway.config import GatewayConfig, ServiceConfig, parse_config
from gateway.core.backend import Backend, ServiceBackend
from gateway.core.calls import WorkerResponse
from gateway.fronts.state import QueueService
from gateway.queue.backend import Backend as StorageBackend
from gateway.queue.backend import MemoryBackend
from gateway.queue.dispatcher import DispatchHost
from gateway.queue.manager import QueueManager
from gateway.queue.redis_backend import RedisBackend
from gateway.queue.sqlite import SqliteBackend
from gateway.worker.direct import ComputeBackend
from tests.gateway.doubles import BackendDouble
from tests.gateway.front.fakes import ECHO_ENTRY, FakePool, FakeQueues
from tests.gateway.queue.test_dispatcher import BootingPool
from tests.gateway.queue.test_dispatcher import FakePool as DispatchPool
from tests.gateway.queue.test_finisher import GatedPool
from tests.gateway.queue.test_store_model_refusals import RefusingBackend
from tests.gateway.routes.inproc import InProcPool
from tests.gateway.routes.test_kserve_metadata import _Pool as MetadataPool
from tests.gateway.routes.test_kserve_versions import _Pool as VersionsPool
from tests.gateway.test_dataplane import Backend as DataPlaneBackend

_VALUE = object()  # a data member of a Protocol (an annotation without a definition)


def protocol_members(proto: type) -> dict[str, Any]:
    """Name -> the Protocol's definition (a function or a property), or ``_VALUE`` for a
    declared attribute; its base Protocols' members included."""
    found: dict[str, Any] = {}
    for base in reversed(proto.__mro__):
        if base in (object, Protocol, Generic):
            continue
        for name in inspect.get_annotations(base):
            found.setdefault(name, _VALUE)
        for name, value in vars(base).items():
            if not name.startswith("_"):
                found[name] = value
    return found


def _parameters(fn: Callable[..., Any]) -> list[tuple[str, Any]]:
    """(name, kind) of each parameter after ``self``."""
    return [(p.name, p.kind) for p in list(inspect.signature(fn).parameters.values())[1:]]


def _awaitable(fn: Callable[..., Any]) -> bool:
    # A plain function that hands back an awaitable counts (the worker's compute queue does,
    # to spare a coroutine frame per call).
    return inspect.iscoroutinefunction(fn) or "Awaitable" in str(inspect.signature(fn).return_annotation)


def breaches(obj: object, proto: type) -> list[str]:
    """What ``obj`` lacks or gets wrong of ``proto``; empty when it implements it in full."""
    cls = type(obj)
    out: list[str] = []
    for name, declared in protocol_members(proto).items():
        found = inspect.getattr_static(cls, name, None)
        if declared is _VALUE or isinstance(declared, property):
            # A property of the class counts without being read (reading it may need state
            # the object under test was made without).
            if not isinstance(found, property) and not hasattr(obj, name):
                out.append(f"{cls.__name__} has no {name}")
            elif inspect.isfunction(found):
                out.append(f"{cls.__name__}.{name} is a method; {proto.__name__} has a value")
            continue
        if not inspect.isfunction(found):
            out.append(f"{cls.__name__} has no method {name}")
            continue
        want, got = _parameters(declared), _parameters(found)
        if got != want:
            out.append(f"{cls.__name__}.{name} takes {[n for n, _ in got]}, not {[n for n, _ in want]}")
        if _awaitable(declared) != _awaitable(found):
            kind = "async" if _awaitable(declared) else "not async"
            out.append(f"{cls.__name__}.{name} must be {kind}")
    return out


def _service(**extra: Any) -> ServiceConfig:
    return ServiceConfig(name="digits", processor="onnx", model="digits.onnx", **extra)


def _pipeline() -> PipelineBackend:
    steps = [{"name": "soft", "transform": "softmax", "inputs": {"x": "request.x"}, "outputs": ["y"]}]
    config = parse_config(
        {
            "services": [
                {
                    "name": "pipe",
                    "processor": "pipeline",
                    "public": True,
                    "pipeline": {"inputs": {"x": "float32"}, "steps": steps, "outputs": {"y": "soft.y"}},
                }
            ]
        }
    )
    return PipelineBackend(config.services[0], GatewayConfig(), {}, pool_factory=FakePool)


def _echo(body: bytes) -> WorkerResponse:
    return WorkerResponse(200, body)


# Built anew for each test: a backend's __init__ starts nothing.
BACKENDS: dict[str, Callable[[], object]] = {
    "WorkerPool": lambda: WorkerPool(_service(), GatewayConfig()),
    "ThreadService": lambda: ThreadService(_service(placement="thread"), GatewayConfig()),
    "PipelineBackend": _pipeline,
    "SourcedBackend": lambda: SourcedBackend(
        WorkerPool(_service(), GatewayConfig()),
        ServiceConfig(name="digits", processor="onnx", model="s3://models/digits.onnx"),
        GatewayConfig(),
    ),
    "fakes.FakePool": lambda: FakePool(_service(), GatewayConfig()),
    "inproc.InProcPool": lambda: InProcPool(
        ServiceConfig(name="echo", processor="python", entry=ECHO_ENTRY), GatewayConfig()
    ),
    "test_dispatcher.FakePool": lambda: DispatchPool(_echo),
    "test_dispatcher.BootingPool": lambda: BootingPool(_echo),
    "test_finisher.GatedPool": lambda: GatedPool(_echo),
    "test_dataplane.Backend": DataPlaneBackend,
    "test_kserve_metadata._Pool": MetadataPool,
    "test_kserve_versions._Pool": VersionsPool,
}


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_service_backend_implements_the_whole_contract(name: str) -> None:
    assert breaches(BACKENDS[name](), ServiceBackend) == []


def test_the_worker_compute_queue_is_a_dataplane_backend() -> None:
    # The narrower contract: what a worker's own dataplane dispatches to.
    assert breaches(ComputeBackend.__new__(ComputeBackend), Backend) == []


@pytest.mark.parametrize("make", [lambda: QueueManager([]), lambda: FakeQueues(set())], ids=["real", "fake"])
@pytest.mark.parametrize("proto", [QueueService, DispatchHost], ids=lambda p: p.__name__)
def test_the_queue_manager_and_its_double_implement_what_their_users_call(
    make: Callable[[], object], proto: type
) -> None:
    assert breaches(make(), proto) == []


STORAGE: dict[str, Callable[[], Any]] = {
    "MemoryBackend": MemoryBackend,
    "SqliteBackend": lambda: SqliteBackend(":memory:"),
    # Connects lazily: made, never used, here (nothing listens on the port).
    "RedisBackend": lambda: RedisBackend("redis://127.0.0.1:9/0"),
    "test_store_model_refusals.RefusingBackend": lambda: RefusingBackend(asyncio.new_event_loop()),
}


@pytest.mark.parametrize("name", sorted(STORAGE))
def test_every_queue_storage_backend_implements_the_whole_contract(name: str) -> None:
    backend = STORAGE[name]()
    try:
        assert breaches(backend, StorageBackend) == []
    finally:
        if isinstance(backend, RefusingBackend):
            backend.loop.close()
        if isinstance(backend, SqliteBackend):
            backend.close()


def test_a_missing_or_mis_signed_member_is_named() -> None:
    class Incomplete(BackendDouble):
        service = _service()
        scale = None  # left out: a backend that cannot scale raises instead

        async def stop(self, timeout: float) -> None:  # a parameter renamed
            pass

        def wait_ready(self, timeout: float) -> bool:  # not async
            return True

        def pending(self) -> int:  # a method where a value is due
            return 0

    assert sorted(breaches(Incomplete(), ServiceBackend)) == [
        "Incomplete has no method scale",
        "Incomplete.pending is a method; ServiceBackend has a value",
        "Incomplete.stop takes ['timeout'], not ['drain_timeout']",
        "Incomplete.wait_ready must be async",
    ]


def test_a_value_the_contract_declares_is_required() -> None:
    class NoService(BackendDouble):
        pass  # no ``service``

    assert breaches(NoService(), ServiceBackend) == ["NoService has no service"]
