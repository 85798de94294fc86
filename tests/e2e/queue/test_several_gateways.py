"""Two gateway processes on one Redis serve the same queue: a record put through one is
watched through the other, and a kill -9 of the serving gateway loses no acknowledged
record and leaves none stuck (the survivor takes the lease over and delivers again what
was delivered but not committed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eas_sdk.queue import AsyncQueueClient
from tests.e2e.gateway_proc import ECHO_ENTRY, GatewayProcess
from tests.redis_server import RedisServer

from .server_proc import TOKEN, GatewayServer, queue_config

REDIS_DB = 3
LEASE_S = 1.0


@pytest.fixture
def gateways(redis_server: RedisServer, tmp_path: Path) -> Iterator[tuple[GatewayServer, GatewayServer]]:
    with redis_server.client(REDIS_DB) as c:
        c.flushdb()
    cfg = queue_config(
        tmp_path / "data",
        ["shared"],
        backend=redis_server.url(REDIS_DB),
        owner_lease_s=LEASE_S,
        heartbeat_s=1.0,
    )
    first = GatewayServer.start(cfg, tmp_path / "a")  # takes the lease: it serves the queue
    try:
        second = GatewayServer.start(cfg, tmp_path / "b")  # forwards to the first
    except BaseException:
        first.kill()
        raise
    yield first, second
    first.kill()
    second.kill()


def _client(server: GatewayServer, uid: str) -> AsyncQueueClient:
    c = AsyncQueueClient(server.endpoint, "shared")
    c.set_token(TOKEN)
    c.init(uid=uid)
    return c


async def test_put_through_one_gateway_is_watched_through_the_other(
    gateways: tuple[GatewayServer, GatewayServer],
) -> None:
    first, second = gateways
    async with _client(first, "p") as producer, _client(second, "w") as consumer:
        sent = [await producer.put(f"r{i}".encode(), tags={"n": str(i)}) for i in range(3)]
        got = []
        watcher = consumer.watch(0, 5)
        async with asyncio.timeout(10):
            async for rec in watcher:
                got.append(rec)
                await consumer.commit(rec.index)
                if len(got) == 3:
                    break
        await watcher.close()
        assert [int(r.index) for r in got] == [int(i) for i, _ in sent]
        assert [r.data for r in got] == [b"r0", b"r1", b"r2"]
        # And the other way round: put through the second, read through the first.
        index, _ = await consumer.put(b"back")
        [rec] = await producer.get(request_id=None, length=1, timeout="1s")
        assert (rec.index, rec.data) == (int(index), b"back")
        attrs = await consumer.attributes()
        assert attrs["stream.length"] == "0" and attrs["meta.backend"] == "redis"


async def test_kill_9_of_the_serving_gateway_loses_nothing_and_strands_nothing(
    gateways: tuple[GatewayServer, GatewayServer],
) -> None:
    first, second = gateways
    async with _client(second, "w") as client:
        put = [int((await client.put(f"r{i}".encode()))[0]) for i in range(20)]  # acknowledged
        watcher = client.watch(0, 5)
        seen: list[int] = []
        committed: set[int] = set()
        async with asyncio.timeout(20):
            async for rec in watcher:
                seen.append(int(rec.index))
                if len(seen) == 5:
                    # Five delivered, none committed: they are pending at the first gateway.
                    first.kill()
                    continue
                if len(seen) > 5:
                    await client.commit(rec.index)
                    committed.add(int(rec.index))
                if committed == set(put):
                    break
        await watcher.close()
        assert watcher.reconnects >= 1
        assert sorted(set(seen[:5])) == put[:5]
        assert sorted(seen[5:]) == put  # the five pending ones came again, nothing else twice
        assert (await client.attributes())["stream.length"] == "0"
        index, _ = await client.put(b"after")  # the survivor serves on
        assert int(index) == put[-1] + 1


async def test_refusals_and_long_polls_come_through_the_forwarding_gateway(
    gateways: tuple[GatewayServer, GatewayServer],
) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    _first, second = gateways
    url = f"ws://{second.endpoint}/api/predict/shared?_watch_=true&_window_=99999"
    with pytest.raises(InvalidStatus) as info:
        await connect(url, additional_headers={"Authorization": TOKEN}, proxy=None)
    assert info.value.response.status_code == 400  # the serving gateway's own refusal
    assert b"_window_" in info.value.response.body
    async with _client(second, "g") as client:
        t0 = asyncio.get_running_loop().time()
        assert await client.get(timeout="1s") == []  # a long poll, answered by the serving gateway
        assert asyncio.get_running_loop().time() - t0 >= 0.5
        with pytest.raises(Exception) as bad:
            await client.commit(424242)  # never put: the serving gateway's 404, passed back
        assert getattr(bad.value, "code", None) == 404


def test_an_async_service_on_redis_is_dispatched_where_its_queues_are_served(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Input put through either gateway is processed by the serving gateway's dispatcher;
    when that gateway is killed, the survivor's dispatcher takes over: every input gets
    exactly one result."""
    from eas_sdk.queue import QueueClient

    with redis_server.client(REDIS_DB) as c:
        c.flushdb()
    cfg = {
        "queue": {"backend": redis_server.url(REDIS_DB), "owner_lease_s": LEASE_S},
        "services": [
            {"name": "aecho", "processor": "python", "entry": ECHO_ENTRY, "async": True, "token": TOKEN}
        ],
    }
    first = GatewayProcess.start(cfg, tmp_path / "a")
    second = None
    try:
        first.wait_workers_ready("aecho", 1)
        second = GatewayProcess.start(cfg, tmp_path / "b")
        second.wait_workers_ready("aecho", 1)
        inputs = QueueClient(second.endpoint, "aecho")  # through the gateway that forwards
        inputs.set_token(TOKEN)
        inputs.init()
        sink = QueueClient(second.endpoint, "aecho/sink")
        sink.set_token(TOKEN)
        sink.init()
        rids = [inputs.put(f"body-{i}".encode())[1] for i in range(20)]
        [res] = sink.get(request_id=rids[0], timeout="5s", auto_delete=False)
        assert res.data == b"body-0" and res.tags["status"] == "200"
        first.kill()  # records may be in flight at its dispatcher, uncommitted
        rids += [inputs.put(f"body-{i}".encode())[1] for i in range(20, 30)]  # retried until served
        deadline = time.monotonic() + 20
        while int(sink.attributes()["stream.length"]) < 30 and time.monotonic() < deadline:
            time.sleep(0.1)
        got = sink.get(index=0, length=100, auto_delete=False, timeout="0s")
        assert sorted(r.tags["requestId"] for r in got) == sorted(rids)  # one result each
        assert sorted(r.data for r in got) == sorted(f"body-{i}".encode() for i in range(30))
        assert inputs.attributes()["stream.length"] == "0"  # every input committed
        inputs.close()
        sink.close()
    finally:
        first.kill()
        if second is not None:
            second.kill()
