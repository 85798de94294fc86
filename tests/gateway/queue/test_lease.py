"""The owner lease against a real redis-server: a holder that finds its key gone (Redis
restarted without its data) gives the queues up and loads them again, instead of renewing
the key and writing on from a state the store no longer has."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio as aioredis

from gateway.queue.lease import Lease
from tests.redis_server import RedisServer

REDIS_DB = 9  # flushed by the test


async def test_a_vanished_lease_is_lost_and_gained_again(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = aioredis.Redis.from_url(redis_server.url(REDIS_DB))
    await client.flushdb()
    events: list[str] = []

    async def gain() -> None:
        events.append("gain")

    async def lose() -> None:
        events.append("lose")

    first = Lease(client, "easq:owner", 5.0, gain, lose)
    other = Lease(client, "easq:owner", 5.0, gain, lose)
    try:
        assert await first.claim() and events == ["gain"]
        assert await first.claim() and events == ["gain"]  # a renewal changes nothing
        assert not await other.claim()  # held: the other forwards
        await client.flushdb()  # what a restart without an append-only file leaves
        with caplog.at_level(logging.WARNING, logger="gateway.queue.lease"):
            assert await first.claim()
        assert events == ["gain", "lose", "gain"]  # its queues loaded again, from the store
        assert "vanished while this gateway held it" in caplog.text
        assert not await other.claim()
    finally:
        await client.flushdb()
        await client.aclose()
