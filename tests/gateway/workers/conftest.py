"""Fixtures for worker, processor and pool tests: sample models and pool factories."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.config import GatewayConfig, ServiceConfig

ROOT = Path(__file__).resolve().parents[3]
ECHO_ENTRY = f"{ROOT / 'samples' / 'processors' / 'echo.py'}:EchoProcessor"


@pytest.fixture(scope="session")
def models() -> dict[str, Path]:
    sys.path.insert(0, str(ROOT / "samples"))
    try:
        from build_models import build_all
    finally:
        sys.path.remove(str(ROOT / "samples"))
    # The default directory is a cache shared by runs (writes are atomic).
    return build_all()


def echo_service(**kw: Any) -> ServiceConfig:
    base: dict[str, Any] = {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, "workers": 1}
    base.update(kw)
    return ServiceConfig(**base)


def fast_gateway(**kw: Any) -> GatewayConfig:
    base: dict[str, Any] = {
        "health_interval_s": 0.2,
        "worker_start_timeout_s": 30.0,
        "shutdown_timeout_s": 5.0,
    }
    base.update(kw)
    return GatewayConfig(**base)


@pytest.fixture
async def make_pool() -> AsyncIterator[Callable[..., Any]]:
    """Start pools with real spawned workers; every pool is stopped at teardown."""
    from gateway.backends.pool import WorkerPool

    pools: list[WorkerPool] = []

    async def make(
        service: ServiceConfig, gateway: GatewayConfig | None = None, ready: bool = True
    ) -> WorkerPool:
        pool = WorkerPool(service, gateway or fast_gateway())
        pools.append(pool)
        await pool.start()
        if ready:
            assert await pool.wait_ready(30), pool.snapshot()
        return pool

    yield make
    for pool in pools:
        await pool.stop(2.0)
