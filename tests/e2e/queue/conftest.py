"""Shared fixtures: one queue server for the module's tests, with a fresh queue name per test."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eas_sdk.queue import QueueClient

from .server_proc import TOKEN, GatewayServer, QueueServer, queue_config

NAMES = [f"q{i}" for i in range(1, 241)]
_counter = itertools.count()


def _shared_config(workdir: Path) -> dict[str, Any]:
    cfg = queue_config(workdir / "data", NAMES, max_length=1000, max_payload_bytes=65536, heartbeat_s=1.0)
    cfg["services"].append(
        {
            "name": "small",
            "processor": "queue",
            "token": TOKEN,
            "queue": {"max_length": 3, "max_payload_bytes": 16},
        }
    )
    return cfg


@pytest.fixture(scope="session")
def queue_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueueServer]:
    workdir: Path = tmp_path_factory.mktemp("queue-server")
    server = QueueServer.start(_shared_config(workdir), workdir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_queue_server(tmp_path_factory: pytest.TempPathFactory, redis_server: Any) -> Iterator[QueueServer]:
    """The same queues in a real redis-server (``queue.backend``), served by the queue-only server."""
    workdir: Path = tmp_path_factory.mktemp("redis-queue-server")
    with redis_server.client(REDIS_SERVER_DB) as c:
        c.flushdb()
    cfg = _shared_config(workdir)
    cfg["queue"] = {"backend": redis_server.url(REDIS_SERVER_DB)}
    server = QueueServer.start(cfg, workdir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gateway_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    """The same queues served by the full gateway (``python -m gateway serve``)."""
    workdir: Path = tmp_path_factory.mktemp("gateway-server")
    server = GatewayServer.start(_shared_config(workdir), workdir)
    yield server
    server.kill()


@pytest.fixture(params=["queue-server", "gateway"])
def any_server(request: pytest.FixtureRequest) -> QueueServer | GatewayServer:
    """Each test that takes it runs against the queue-only server and the full gateway."""
    name = "queue_server" if request.param == "queue-server" else "gateway_server"
    server: QueueServer | GatewayServer = request.getfixturevalue(name)
    return server


STORE_REDIS_DB = 6
REDIS_SERVER_DB = 7


@pytest.fixture(params=["sqlite", "redis"])
def store_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Queue settings for each store a test should run against: the embedded SQLite store,
    and a real redis-server (flushed first; a short owner lease, so that a server restarted
    after a kill -9 serves the queues again within a second)."""
    if request.param == "sqlite":
        return {}
    redis_server = request.getfixturevalue("redis_server")
    with redis_server.client(STORE_REDIS_DB) as c:
        c.flushdb()
    return {"backend": redis_server.url(STORE_REDIS_DB), "owner_lease_s": 1.0}


@pytest.fixture
def queue_name() -> str:
    n = next(_counter)
    if n >= len(NAMES):
        pytest.fail("tests/e2e/queue/conftest.py: add more queue names")
    return NAMES[n]


def _clients(endpoint: str, queue_name: str) -> Iterator[Callable[..., QueueClient]]:
    """``make(uid=None, gid="eas", name=None)`` -> an initialised client; all closed after."""
    clients: list[QueueClient] = []

    def make(uid: str | None = None, gid: str = "eas", name: str | None = None) -> QueueClient:
        c = QueueClient(endpoint, name or queue_name)
        c.set_token(TOKEN)
        c.init(uid=uid, gid=gid)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


@pytest.fixture
def make_client(queue_server: QueueServer, queue_name: str) -> Iterator[Callable[..., QueueClient]]:
    yield from _clients(queue_server.endpoint, queue_name)


@pytest.fixture(params=["sqlite", "redis"])
def store_server(request: pytest.FixtureRequest) -> QueueServer:
    """The queue-only server with the queues in each store: the same checks prove the same semantics."""
    name = "queue_server" if request.param == "sqlite" else "redis_queue_server"
    server: QueueServer = request.getfixturevalue(name)
    return server


@pytest.fixture
def store_client(store_server: QueueServer, queue_name: str) -> Iterator[Callable[..., QueueClient]]:
    """``make_client`` for ``store_server``."""
    yield from _clients(store_server.endpoint, queue_name)


@pytest.fixture
def any_client(
    any_server: QueueServer | GatewayServer, queue_name: str
) -> Iterator[Callable[..., QueueClient]]:
    """``make_client`` for ``any_server``."""
    yield from _clients(any_server.endpoint, queue_name)
