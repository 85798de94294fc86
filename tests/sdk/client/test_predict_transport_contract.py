"""Contract suite, transport failures, timeouts and the connection pool: every test runs
against PredictClient (sync) and AsyncPredictClient, with a real aiohttp server on
127.0.0.1 that drops, delays, trickles or truncates its answers on cue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import psutil
import pytest

from eas_sdk import ENDPOINT_TYPE_DIRECT
from eas_sdk._core.retry import RetryPolicy
from eas_sdk.errors import (
    ConnectError,
    PredictException,
    TimeoutError,
    TransportError,
)
from tests.waiting import async_wait_until

from .conftest import FAST, TOKEN, Raw, endpoint_item
from .fake_eas import Delay, Drop, FakeEAS, Trickle, Truncate

pytestmark = pytest.mark.timeout(30)


# --- transport failures and timeouts -------------------------------------------------


async def test_connection_refused_is_retried_then_connect_error(make_client: Any, servers: Any) -> None:
    s = servers()
    port = s.port
    s.stop()
    h = make_client(f"127.0.0.1:{port}", "echo", token=TOKEN, retry_count=2, retry_policy=FAST)
    with pytest.raises(ConnectError) as info:
        await h.predict(Raw(b"x"))
    assert info.value.code == 500
    assert TOKEN not in str(info.value)


async def test_attempt_timeout_then_retry_elsewhere_in_time(server: FakeEAS, make_client: Any) -> None:
    server.push(Delay(2.0))
    h = make_client(server.url, "echo", token=TOKEN, timeout=300, retry_count=1, retry_policy=FAST)
    assert await h.predict(Raw(b"late")) == b"late"
    assert len(server.predicts) == 2  # the answer came from the retry: the slow one was left


async def test_all_attempts_time_out(server: FakeEAS, make_client: Any) -> None:
    server.default = Delay(2.0)
    h = make_client(server.url, "echo", token=TOKEN, timeout=200, retry_count=1, retry_policy=FAST)
    with pytest.raises(TimeoutError) as info:  # not the answers, 2 s later
        await h.predict(Raw(b"x"))
    assert isinstance(info.value, PredictException) and info.value.code == 500
    assert len(server.predicts) == 2


async def test_overall_deadline_caps_the_call(server: FakeEAS, make_client: Any) -> None:
    server.default = Delay(2.0)
    policy = RetryPolicy(retries=5, backoff_base=0.001, max_total=0.4)
    h = make_client(server.url, "echo", token=TOKEN, timeout=1000, retry_policy=policy)
    with pytest.raises(TimeoutError):
        await h.predict(Raw(b"x"))
    # Cut at 0.4 s with no time left for a retry (the attempt's own 1 s would leave some).
    assert len(server.predicts) == 1
    assert int(server.predicts[0].headers["X-Eas-Deadline-Ms"]) <= 400


async def test_dropped_fresh_connection_is_one_attempt_with_no_retries(
    server: FakeEAS, make_client: Any
) -> None:
    # retry_count=0 is exactly one attempt, also when a new connection is dropped.
    server.push(Drop())
    h = make_client(server.url, "echo", token=TOKEN, retry_count=0)
    with pytest.raises(ConnectError):
        await h.predict(Raw(b"once"))
    assert len(server.predicts) == 1


async def test_dropped_reused_connection_is_resent_without_using_a_retry(
    server: FakeEAS, make_client: Any
) -> None:
    # A pooled keep-alive connection that dies before any response byte (the
    # request raced the server's idle close) is re-sent at once on a new one.
    h = make_client(server.url, "echo", token=TOKEN, retry_count=0)
    assert await h.predict(Raw(b"first")) == b"first"
    server.push(Drop())
    assert await h.predict(Raw(b"again")) == b"again"
    first, dropped, resent = server.predicts
    assert dropped.peer_port == first.peer_port  # the dropped attempt reused the pooled connection
    assert resent.peer_port != dropped.peer_port
    assert resent.headers["X-Request-Id"] == dropped.headers["X-Request-Id"]


async def test_stale_keepalive_connections_cause_no_errors(servers: Any, make_client: Any) -> None:
    # Calls spaced by the server's keep-alive timeout race its idle close. Without
    # the transparent re-send the async client fails a few of these (measured 3-5/30).
    s = servers(tokens=[TOKEN], keepalive_timeout=0.1)
    h = make_client(s.url, "echo", token=TOKEN, retry_count=0)
    for i in range(25):
        assert await h.predict(Raw(b"k%d" % i)) == b"k%d" % i
        await asyncio.sleep(0.1)  # calls spaced by the server's keep-alive timeout
    assert len({r.peer_port for r in s.predicts}) > 1  # the server really closed idle connections


@pytest.mark.parametrize("limit", ["attempt", "deadline"])
async def test_slow_trickle_is_bounded_by_the_timeout(server: FakeEAS, make_client: Any, limit: str) -> None:
    # Headers at once, then a byte every 150 ms: the whole attempt (not each read) is
    # bounded by the per-attempt timeout, and the call by its overall deadline.
    server.push(Trickle(length=10, interval=0.15))
    if limit == "attempt":
        h = make_client(server.url, "echo", token=TOKEN, timeout=300, retry_count=2, retry_policy=FAST)
    else:
        policy = RetryPolicy(retries=2, backoff_base=0.001, max_total=0.3)
        h = make_client(server.url, "echo", token=TOKEN, timeout=5000, retry_policy=policy)
    # The trickle never pauses for as long as the bound: only a bound on the whole attempt
    # (or call), not one per read, makes this a timeout rather than the 1.5 s answer.
    with pytest.raises(TimeoutError):
        await h.predict(Raw(b"x"))
    assert len(server.predicts) == 1  # the response had started: not retried


async def test_truncated_response_is_final(server: FakeEAS, make_client: Any) -> None:
    # Content-Length 10, 3 bytes, then the connection closes: the server answered,
    # so this is not retried, and the error says so (not a connect error).
    server.push(Truncate(declared=10, sent=3))
    h = make_client(server.url, "echo", token=TOKEN, retry_count=2, retry_policy=FAST)
    with pytest.raises(TransportError) as info:
        await h.predict(Raw(b"x"))
    assert not isinstance(info.value, (ConnectError, TimeoutError))
    assert len(server.predicts) == 1


async def test_pool_wait_counts_against_the_attempt_timeout(
    server: FakeEAS, make_client: Any, kind: str
) -> None:
    # The only connection is busy for 2.5 s with a call made under a 10 s timeout. A second
    # call with a 1 s timeout gives up while it still waits for the connection, never sent;
    # one whose pool wait did not count would be sent once the connection is free.
    server.push(Delay(2.5))
    h = make_client(server.url, "echo", token=TOKEN, max_connection_count=1, timeout=10_000, retry_count=0)
    await h.init()
    first = asyncio.create_task(h.predict(Raw(b"a")))
    await async_wait_until(lambda: server.active >= 1, 10, "the first call at the server")
    h.client.set_timeout(1000)  # read by each call as it starts
    with pytest.raises(TimeoutError):
        await h.predict(Raw(b"b"))
    assert len(server.predicts) == 1
    assert await first == b"a"
    assert len(server.predicts) == 1


@pytest.mark.parametrize("expiry", [0.2, 10.0])
async def test_idle_pooled_connection_expires(server: FakeEAS, make_client: Any, expiry: float) -> None:
    # A connection idle longer than keepalive_expiry is not reused (the server's
    # keep-alive here is 75 s, so only the client's expiry can close it).
    h = make_client(server.url, "echo", token=TOKEN, keepalive_expiry=expiry)
    assert await h.predict(Raw(b"1")) == b"1"
    await asyncio.sleep(0.4)  # idle for longer than the short expiry
    assert await h.predict(Raw(b"2")) == b"2"
    first, second = server.predicts
    assert (first.peer_port == second.peer_port) is (expiry > 0.4)


# --- connection pool limit -------------------------------------------------------------


def _client_sockets_to(port: int) -> int:
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


async def test_pool_limit_bounds_open_sockets(server: FakeEAS, make_client: Any, kind: str) -> None:
    server.default = Delay(0.15)
    limit, calls = 4, 16
    h = make_client(server.url, "echo", token=TOKEN, max_connection_count=limit, timeout=5000)
    await h.init()
    peak = 0
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, await asyncio.to_thread(_client_sockets_to, server.port))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    if kind == "sync":
        with concurrent.futures.ThreadPoolExecutor(calls) as ex:
            results = await asyncio.gather(
                *(
                    asyncio.wrap_future(ex.submit(h.client.predict, Raw(b"%d" % i)))  # type: ignore[arg-type]
                    for i in range(calls)
                )
            )
    else:
        results = await asyncio.gather(*(h.predict(Raw(b"%d" % i)) for i in range(calls)))
    stop.set()
    await sampler
    assert sorted(results) == sorted(b"%d" % i for i in range(calls))
    assert len(server.predicts) == calls
    assert server.max_active <= limit
    assert len({r.peer_port for r in server.predicts}) <= limit
    assert 0 < peak <= limit


async def test_pool_limit_is_per_endpoint(servers: Any, make_client: Any, kind: str) -> None:
    # max_connection_count bounds the connections to each endpoint, in both clients.
    disc, a, b = servers(), servers(tokens=[TOKEN]), servers(tokens=[TOKEN])
    a.default = b.default = Delay(0.3)
    disc.set_endpoints([endpoint_item(a, 1), endpoint_item(b, 1)])
    h = make_client(disc.url, "echo", token=TOKEN, endpoint_type=ENDPOINT_TYPE_DIRECT, max_connection_count=2)
    await h.init()
    calls = 8
    if kind == "sync":
        with concurrent.futures.ThreadPoolExecutor(calls) as ex:
            results = await asyncio.gather(
                *(asyncio.wrap_future(ex.submit(h.client.predict, Raw(b"%d" % i))) for i in range(calls))
            )
    else:
        results = await asyncio.gather(*(h.predict(Raw(b"%d" % i)) for i in range(calls)))
    assert sorted(results) == sorted(b"%d" % i for i in range(calls))
    assert a.max_active == 2 and b.max_active == 2
    assert len({r.peer_port for r in a.predicts}) <= 2 and len({r.peer_port for r in b.predicts}) <= 2
