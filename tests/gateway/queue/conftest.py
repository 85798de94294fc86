"""What the queue tests share: an async service and its queues (the dispatcher's and the
finisher's tests), and each storage engine behind a manager (``store``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.config import QueueConfig, ServiceConfig
from gateway.queue.manager import QueueManager
from tests.gateway.queue.test_backend_conformance import REDIS_DB, Store
from tests.redis_server import RedisServer


def async_service(workers: int = 2, max_length: int = 100_000) -> ServiceConfig:
    """An ``async: true`` service (its input queue and sink) for a dispatcher under test."""
    return ServiceConfig(
        name="asvc",
        processor="onnx",
        model="m.onnx",
        workers=workers,
        timeout_ms=2000,
        async_=True,
        queue=QueueConfig(max_length=max_length),
    )


@pytest.fixture
async def qm(tmp_path: Path) -> AsyncIterator[QueueManager]:
    m = QueueManager([async_service()], str(tmp_path))
    await m.start()
    yield m
    await m.stop()


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    redis: RedisServer | None = None
    if request.param == "redis":
        redis = request.getfixturevalue("redis_server")
        with redis.client(REDIS_DB) as c:
            c.flushdb()
    yield Store(request.param, tmp_path, redis)
    if redis is not None:
        with redis.client() as c:
            c.config_set("min-replicas-to-write", 0)
