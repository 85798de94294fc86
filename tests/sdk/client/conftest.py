"""Fixtures for the predict-client contract suite: a fake EAS server and both clients."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from eas_sdk._core.retry import RetryPolicy
from eas_sdk.predict import AsyncPredictClient, PredictClient

from .fake_eas import FakeEAS

TOKEN = "dG9rZW4xMjM=-secret-token-value"
# Fast back-off for tests that count attempts; the real defaults have their own tests.
FAST = RetryPolicy(backoff_base=0.001, backoff_cap=0.005)


class Raw:
    """Minimal request object: what the clients need from eas_sdk.requests classes."""

    def __init__(self, data: bytes | str) -> None:
        self.data = data

    def to_string(self) -> bytes | str:
        return self.data

    def parse_response(self, body: bytes) -> bytes:
        return body


class Harness:
    """One client of either kind behind an awaitable interface."""

    def __init__(self, kind: str, *args: Any, **kwargs: Any) -> None:
        self.kind = kind
        cls = PredictClient if kind == "sync" else AsyncPredictClient
        self.client: Any = cls(*args, **kwargs)

    async def init(self) -> None:
        if self.kind == "sync":
            self.client.init()
        else:
            await self.client.init()

    async def predict(self, req: Any) -> Any:
        if self.kind == "sync":
            return await asyncio.to_thread(self.client.predict, req)
        return await self.client.predict(req)

    async def close(self) -> None:
        if self.kind == "sync":
            self.client.close()
        else:
            await self.client.close()


def endpoint_item(s: FakeEAS, weight: int) -> dict[str, Any]:
    """One endpoint of a discovery answer, pointing at ``s``."""
    return {"ip": "127.0.0.1", "port": str(s.port), "weight": weight}


def _start(**kwargs: Any) -> FakeEAS:
    return FakeEAS(**kwargs).start()


@pytest.fixture
def server() -> Iterator[FakeEAS]:
    s = _start(tokens=[TOKEN])
    yield s
    s.stop()


@pytest.fixture
def open_server() -> Iterator[FakeEAS]:
    """A server for a service without a token (any Authorization is accepted)."""
    s = _start()
    yield s
    s.stop()


@pytest.fixture
def servers() -> Iterator[Callable[..., FakeEAS]]:
    started: list[FakeEAS] = []

    def make(**kwargs: Any) -> FakeEAS:
        s = _start(**kwargs)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_client(kind: str) -> AsyncIterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(*args: Any, **kwargs: Any) -> Harness:
        h = Harness(kind, *args, **kwargs)
        made.append(h)
        return h

    yield make
    for h in made:
        await h.close()
