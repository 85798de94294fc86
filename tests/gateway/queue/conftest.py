"""What the dispatcher's and the finisher's tests share: an async service and its queues."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.config import QueueConfig, ServiceConfig
from gateway.queue.manager import QueueManager


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
