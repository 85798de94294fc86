"""Contract suite: every test runs against PredictClient (sync) and AsyncPredictClient.

A real aiohttp server on 127.0.0.1 verifies the EAS signatures with
gateway.auth.verify and answers scripted statuses; attempts are counted on the
server side.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import time
from typing import Any

import psutil
import pytest

from eas_sdk import ENDPOINT_TYPE_DIRECT, ENDPOINT_TYPE_VIPSERVER
from eas_sdk._core.auth import content_md5
from eas_sdk._core.retry import RetryPolicy
from eas_sdk.errors import (
    AuthenticationError,
    BadRequestError,
    ClientHTTPError,
    ConnectError,
    GatewayTimeoutError,
    NoEndpointError,
    NotFoundError,
    PayloadTooLargeError,
    PredictException,
    QueueFullError,
    ServerHTTPError,
    ServiceUnavailableError,
    TimeoutError,
    TooManyRequestsError,
    TransportError,
)

from .conftest import FAST, TOKEN, Raw
from .fake_eas import Delay, Drop, FakeEAS, Reply, Trickle, Truncate

pytestmark = pytest.mark.timeout(30)


# --- authentication schemes ---------------------------------------------------------------


async def test_gateway_mode_signs_with_eas_hmac(server: FakeEAS, make_client: Any) -> None:
    h = make_client(server.url, "echo", token=TOKEN)
    assert await h.predict(Raw(b"hello")) == b"hello"
    (rec,) = server.predicts
    assert rec.auth_ok
    assert rec.path == "/api/predict/echo"
    assert re.fullmatch(r"EAS [A-Za-z0-9+/]{27}=", rec.headers["Authorization"])
    assert rec.headers["Content-MD5"] == content_md5(b"hello")
    assert rec.headers["Content-Type"] == "application/octet-stream"
    assert rec.headers["Date"].endswith(" GMT")
    assert re.fullmatch(r"[0-9a-f]{32}", rec.headers["X-Request-Id"])
    assert rec.headers["X-Eas-Deadline-Ms"] == "5000"  # the per-attempt timeout
    assert rec.headers["Accept-Encoding"] == "identity"  # never ask for gzip


async def test_service_name_with_sub_path_is_signed(server: FakeEAS, make_client: Any) -> None:
    h = make_client(server.url + "/", "echo/sub/path", token=TOKEN)
    assert await h.predict(Raw("text body")) == b"text body"
    (rec,) = server.predicts
    assert rec.auth_ok and rec.path == "/api/predict/echo/sub/path"


async def test_wrong_token_is_one_attempt_and_401(server: FakeEAS, make_client: Any) -> None:
    h = make_client(server.url, "echo", token="not-the-token")
    with pytest.raises(AuthenticationError) as info:
        await h.predict(Raw(b"x"))
    assert info.value.code == 401
    assert len(server.predicts) == 1


async def test_custom_url_sends_raw_token(server: FakeEAS, make_client: Any) -> None:
    url = f"{server.url}/api/predict/echo?mode=x"
    h = make_client(custom_url=url, token=TOKEN)
    assert await h.predict(Raw(b"abc")) == b"abc"
    (rec,) = server.predicts
    assert rec.auth_ok
    assert rec.headers["Authorization"] == TOKEN
    assert "Content-MD5" not in rec.headers
    assert rec.query == "mode=x"


async def test_direct_mode_signs_each_worker_request(servers: Any, make_client: Any) -> None:
    disc, worker = servers(), servers(tokens=[TOKEN])
    disc.set_endpoints([{"ip": "127.0.0.1", "port": worker.port, "weight": 1}])
    h = make_client(disc.url, "echo", token=TOKEN, endpoint_type=ENDPOINT_TYPE_DIRECT, discovery_interval=0.1)
    assert await h.predict(Raw(b"d")) == b"d"
    (rec,) = worker.predicts
    assert rec.auth_ok and rec.headers["Authorization"].startswith("EAS ")


# --- headers never leak between calls -------------------------------------------------------


async def test_headers_are_fresh_per_call_and_token_can_be_removed(
    open_server: FakeEAS, make_client: Any
) -> None:
    h = make_client(open_server.url, "echo", token=TOKEN, retry_policy=FAST)
    h.client.add_extra_headers({"X-Custom": "1"})
    await h.predict(Raw(b"a"))
    await h.predict(Raw(b"bb"))
    h.client.set_token("")
    await h.predict(Raw(b"ccc"))
    first, second, third = open_server.predicts
    assert first.headers["Content-MD5"] == content_md5(b"a")
    assert second.headers["Content-MD5"] == content_md5(b"bb")
    assert first.headers["X-Request-Id"] != second.headers["X-Request-Id"]
    assert "Authorization" not in third.headers
    assert "Content-MD5" not in third.headers
    assert all(r.headers["X-Custom"] == "1" for r in (first, second, third))


async def test_every_attempt_is_signed_afresh(server: FakeEAS, make_client: Any) -> None:
    server.push(Reply(503, delay=0.05), Reply(502, delay=0.05))
    policy = RetryPolicy(backoff_base=0.001, max_total=1.0)
    h = make_client(server.url, "echo", token=TOKEN, timeout=1000, retry_policy=policy)
    assert await h.predict(Raw(b"retry me")) == b"retry me"
    recs = server.predicts
    assert len(recs) == 3 and all(r.auth_ok for r in recs)
    # One request id per call; the deadline shrinks once the 1 s overall budget binds.
    assert len({r.headers["X-Request-Id"] for r in recs}) == 1
    deadlines = [int(r.headers["X-Eas-Deadline-Ms"]) for r in recs]
    assert deadlines == sorted(deadlines, reverse=True) and deadlines[-1] < deadlines[0]


async def test_content_type_rules(open_server: FakeEAS, make_client: Any) -> None:
    h = make_client(open_server.url, "echo", token=TOKEN, headers={"content-type": "application/json"})
    await h.predict(Raw(b"{}"))
    h.client.set_content_type("text/plain")
    await h.predict(Raw(b"{}"))
    first, second = open_server.predicts
    assert first.headers["Content-Type"] == "application/json"
    assert second.headers["Content-Type"] == "text/plain"


# --- retries by status ----------------------------------------------------------


@pytest.mark.parametrize("status", [450, 500, 502, 503, 504])
async def test_retryable_status_makes_one_plus_retries_attempts(
    server: FakeEAS, make_client: Any, status: int
) -> None:
    server.default = Reply(status, b"busy")
    h = make_client(server.url, "echo", token=TOKEN, retry_count=3, retry_policy=FAST)
    with pytest.raises(PredictException) as info:
        await h.predict(Raw(b"x"))
    assert info.value.code == status
    assert info.value.message == "busy" and info.value.body == b"busy"  # type: ignore[attr-defined]
    assert info.value.status == status and info.value.attempts == 4
    assert len(server.predicts) == 4


@pytest.mark.parametrize(
    ("status", "exc"),
    [
        (400, BadRequestError),
        (403, AuthenticationError),
        (404, NotFoundError),
        (405, ClientHTTPError),
        (413, PayloadTooLargeError),
        (429, TooManyRequestsError),
        (201, PredictException),
    ],
)
async def test_non_retryable_status_is_one_attempt(
    server: FakeEAS, make_client: Any, status: int, exc: type[Exception]
) -> None:
    server.default = Reply(status, b"no")
    h = make_client(server.url, "echo", token=TOKEN, retry_policy=FAST)
    with pytest.raises(exc) as info:
        await h.predict(Raw(b"x"))
    assert info.value.code == status  # type: ignore[attr-defined]
    assert len(server.predicts) == 1


async def test_default_policy_exactly_six_attempts_on_503(server: FakeEAS, make_client: Any) -> None:
    server.default = Reply(503)
    h = make_client(server.url, "echo", token=TOKEN)
    with pytest.raises(ServiceUnavailableError):
        await h.predict(Raw(b"x"))
    assert len(server.predicts) == 6


async def test_retry_count_zero_is_exactly_one_attempt(server: FakeEAS, make_client: Any) -> None:
    server.default = Reply(503)
    h = make_client(server.url, "echo", token=TOKEN)
    h.client.set_retry_count(0)
    with pytest.raises(ServiceUnavailableError):
        await h.predict(Raw(b"x"))
    assert len(server.predicts) == 1


async def test_500_retry_can_be_switched_off(server: FakeEAS, make_client: Any) -> None:
    server.default = Reply(500)
    policy = RetryPolicy(backoff_base=0.001, retry_on_500=False)
    h = make_client(server.url, "echo", token=TOKEN, retry_policy=policy)
    with pytest.raises(ServerHTTPError):
        await h.predict(Raw(b"x"))
    assert len(server.predicts) == 1


async def test_error_classes_per_status(server: FakeEAS, make_client: Any) -> None:
    h = make_client(server.url, "echo", token=TOKEN, retry_count=0)
    for status, cls in ((450, QueueFullError), (503, ServiceUnavailableError), (504, GatewayTimeoutError)):
        server.push(Reply(status))
        with pytest.raises(cls):
            await h.predict(Raw(b"x"))


async def test_429_with_retry_after_waits_then_retries(server: FakeEAS, make_client: Any) -> None:
    server.push(Reply(429, headers={"Retry-After": "1"}))
    h = make_client(server.url, "echo", token=TOKEN, retry_policy=FAST)
    assert await h.predict(Raw(b"ok")) == b"ok"
    first, second = server.predicts
    assert second.at - first.at >= 0.95  # the server's hint was honoured


async def test_429_with_too_long_retry_after_is_not_retried(server: FakeEAS, make_client: Any) -> None:
    server.default = Reply(429, headers={"Retry-After": "120"})
    h = make_client(server.url, "echo", token=TOKEN, retry_policy=FAST)
    with pytest.raises(TooManyRequestsError) as info:
        await h.predict(Raw(b"x"))
    assert info.value.headers.get("Retry-After") == "120"
    assert len(server.predicts) == 1


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
    t0 = time.monotonic()
    assert await h.predict(Raw(b"late")) == b"late"
    assert time.monotonic() - t0 < 1.9  # did not wait for the slow answer
    assert len(server.predicts) == 2


async def test_all_attempts_time_out(server: FakeEAS, make_client: Any) -> None:
    server.default = Delay(2.0)
    h = make_client(server.url, "echo", token=TOKEN, timeout=200, retry_count=1, retry_policy=FAST)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        await h.predict(Raw(b"x"))
    assert time.monotonic() - t0 < 1.5
    assert isinstance(info.value, PredictException) and info.value.code == 500
    assert len(server.predicts) == 2


async def test_overall_deadline_caps_the_call(server: FakeEAS, make_client: Any) -> None:
    server.default = Delay(2.0)
    policy = RetryPolicy(retries=5, backoff_base=0.001, max_total=0.4)
    h = make_client(server.url, "echo", token=TOKEN, timeout=1000, retry_policy=policy)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await h.predict(Raw(b"x"))
    assert time.monotonic() - t0 < 1.5
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
        await asyncio.sleep(0.1)
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
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await h.predict(Raw(b"x"))
    assert time.monotonic() - t0 <= 0.3 + 0.2
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
    # With one connection busy for 0.6 s, a second call with a 1 s timeout must give up
    # 1 s after it started, not 0.6 s of pool wait plus a fresh 1 s. (The first call keeps
    # 0.4 s of slack for a loaded machine.)
    server.push(Delay(0.6), Delay(3.0))
    h = make_client(server.url, "echo", token=TOKEN, max_connection_count=1, timeout=1000, retry_count=0)
    await h.init()
    first = asyncio.create_task(h.predict(Raw(b"a")))
    deadline = time.monotonic() + 5
    while server.active < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await h.predict(Raw(b"b"))
    assert time.monotonic() - t0 <= 1.0 + 0.35  # not 0.6 + 1.0
    assert await first == b"a"


@pytest.mark.parametrize("expiry", [0.2, 10.0])
async def test_idle_pooled_connection_expires(server: FakeEAS, make_client: Any, expiry: float) -> None:
    # A connection idle longer than keepalive_expiry is not reused (the server's
    # keep-alive here is 75 s, so only the client's expiry can close it).
    h = make_client(server.url, "echo", token=TOKEN, keepalive_expiry=expiry)
    assert await h.predict(Raw(b"1")) == b"1"
    await asyncio.sleep(0.4)
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
    disc.set_endpoints([_ep(a, 1), _ep(b, 1)])
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


# --- direct mode ------------------------------------------------------------


def _ep(s: FakeEAS, weight: int) -> dict[str, Any]:
    return {"ip": "127.0.0.1", "port": str(s.port), "weight": weight}


async def test_direct_mode_follows_weights(servers: Any, make_client: Any) -> None:
    disc, a, b = servers(), servers(tokens=[TOKEN]), servers(tokens=[TOKEN])
    disc.set_endpoints([_ep(a, 1), _ep(b, 3)])
    h = make_client(disc.url, "echo", token=TOKEN, endpoint_type=ENDPOINT_TYPE_DIRECT)
    for i in range(40):
        assert await h.predict(Raw(b"%d" % i)) == b"%d" % i
    share_a = len(a.predicts) / 40
    assert 0.2 <= share_a <= 0.3
    assert len(a.predicts) + len(b.predicts) == 40


async def test_direct_mode_fails_over_to_an_untried_endpoint(servers: Any, make_client: Any) -> None:
    disc, bad, good = servers(), servers(tokens=[TOKEN]), servers(tokens=[TOKEN])
    bad.default = Reply(503)
    disc.set_endpoints([_ep(bad, 1), _ep(good, 1)])
    h = make_client(disc.url, "echo", token=TOKEN, endpoint_type=ENDPOINT_TYPE_DIRECT, retry_count=1)
    h.client.set_timeout(2000)
    for i in range(10):
        assert await h.predict(Raw(b"%d" % i)) == b"%d" % i
    assert len(good.predicts) == 10
    assert 1 <= len(bad.predicts) <= 10


async def test_direct_mode_keeps_last_list_when_discovery_fails(
    servers: Any, make_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="eas_sdk")
    disc, w = servers(), servers(tokens=[TOKEN])
    disc.set_endpoints([_ep(w, 1)])
    h = make_client(
        disc.url, "echo", token=TOKEN, endpoint_type=ENDPOINT_TYPE_DIRECT, discovery_interval=0.05
    )
    assert await h.predict(Raw(b"1")) == b"1"
    disc.discovery = lambda: (500, b"boom")
    hits = len(disc.discovery_hits)
    deadline = time.monotonic() + 5
    while len(disc.discovery_hits) < hits + 4 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    disc.stop()  # now connections are refused as well
    for i in range(5):
        assert await h.predict(Raw(b"%d" % i)) == b"%d" % i
        await asyncio.sleep(0.05)
    warnings = [r for r in caplog.records if r.name.startswith("eas_sdk") and r.levelno >= logging.WARNING]
    assert len(warnings) == 1  # rate-limited: one per 30 s
    assert "keeping 1 known endpoints" in warnings[0].getMessage()


async def test_direct_mode_stops_using_a_removed_endpoint(servers: Any, make_client: Any) -> None:
    disc, a, b = servers(), servers(tokens=[TOKEN]), servers(tokens=[TOKEN])
    disc.set_endpoints([_ep(a, 1), _ep(b, 1)])
    h = make_client(
        disc.url, "echo", token=TOKEN, endpoint_type=ENDPOINT_TYPE_DIRECT, discovery_interval=0.05
    )
    for i in range(4):
        await h.predict(Raw(b"%d" % i))
    assert a.predicts and b.predicts
    disc.set_endpoints([_ep(b, 1)])
    hits = len(disc.discovery_hits)
    deadline = time.monotonic() + 5
    while len(disc.discovery_hits) < hits + 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    before = len(a.predicts)
    for i in range(10):
        assert await h.predict(Raw(b"%d" % i)) == b"%d" % i
    assert len(a.predicts) == before


async def test_direct_mode_without_endpoints_raises_no_endpoint(servers: Any, make_client: Any) -> None:
    disc = servers()
    disc.discovery = lambda: (503, b"")
    h = make_client(
        disc.url,
        "echo",
        endpoint_type=ENDPOINT_TYPE_DIRECT,
        discovery_interval=0.05,
        first_discovery_wait=0.3,
    )
    with pytest.raises(NoEndpointError) as info:
        await h.predict(Raw(b"x"))
    assert "timeout" in str(info.value)
    disc.set_endpoints([])
    deadline = time.monotonic() + 5
    while not h.client.endpoints.ready and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    with pytest.raises(NoEndpointError, match="No backend"):
        await h.predict(Raw(b"x"))


async def test_hanging_discovery_on_first_use_raises_no_endpoint_in_time(
    servers: Any, make_client: Any
) -> None:
    # Discovery accepts the request and never answers: the first call fails with the
    # clear no-endpoint error after first_discovery_wait, and every discovery round
    # is abandoned after discovery_timeout (so rounds keep coming).
    disc = servers()
    disc.discovery_hang = True
    h = make_client(
        disc.url,
        "echo",
        endpoint_type=ENDPOINT_TYPE_DIRECT,
        discovery_interval=0.05,
        discovery_timeout=0.2,
        first_discovery_wait=0.5,
    )
    t0 = time.monotonic()
    with pytest.raises(NoEndpointError, match="timeout"):
        await h.predict(Raw(b"x"))
    assert time.monotonic() - t0 <= 0.5 + 0.3
    deadline = time.monotonic() + 5
    while len(disc.discovery_hits) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert len(disc.discovery_hits) >= 3


async def test_hanging_discovery_keeps_the_last_endpoints(servers: Any, make_client: Any) -> None:
    disc, w = servers(), servers(tokens=[TOKEN])
    disc.set_endpoints([_ep(w, 1)])
    h = make_client(
        disc.url,
        "echo",
        token=TOKEN,
        endpoint_type=ENDPOINT_TYPE_DIRECT,
        discovery_interval=0.05,
        discovery_timeout=0.2,
    )
    assert await h.predict(Raw(b"0")) == b"0"
    disc.discovery_hang = True
    hits = len(disc.discovery_hits)
    end = time.monotonic() + 1.0
    i = 0
    while time.monotonic() < end:
        i += 1
        assert await h.predict(Raw(b"%d" % i)) == b"%d" % i
        await asyncio.sleep(0.05)
    deadline = time.monotonic() + 5
    while len(disc.discovery_hits) < hits + 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert len(disc.discovery_hits) >= hits + 3  # each hung round gave up after 0.2 s
    t0 = time.monotonic()
    await h.close()
    assert time.monotonic() - t0 < 1.0


# --- secrets and API surface -------------------------------------------------------------


async def test_token_never_in_repr_errors_or_logs(
    server: FakeEAS, make_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server.push(Reply(503), Drop(), Reply(401, b"denied"))
    h = make_client(server.url, "echo", token=TOKEN, retry_policy=FAST)
    h.client.add_extra_headers({"X-Trace": "t"})
    with pytest.raises(AuthenticationError) as info:
        await h.predict(Raw(b"x"))
    signatures = {r.headers["Authorization"].split(" ", 1)[1] for r in server.predicts}
    texts = [repr(h.client), str(h.client), str(info.value), repr(info.value), caplog.text]
    texts += [str(a) for a in info.value.args]
    for text in texts:
        assert TOKEN not in text
        for sig in signatures:
            assert sig not in text
    assert "token=***" in repr(h.client)
    assert any("retrying" in r.getMessage() for r in caplog.records)


async def test_vipserver_is_rejected_at_init(make_client: Any) -> None:
    h = make_client("http://127.0.0.1:1", "echo", endpoint_type=ENDPOINT_TYPE_VIPSERVER)
    with pytest.raises(PredictException, match="VIPSERVER"):
        await h.init()


async def test_missing_endpoint_outside_eas(make_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NAMESPACE", raising=False)
    h = make_client("", "echo")
    with pytest.raises(PredictException, match="'endpoint' must be set"):
        await h.init()


def test_sync_context_manager_and_reinit(server: FakeEAS) -> None:
    from eas_sdk import PredictClient

    with PredictClient(server.url, "echo", token=TOKEN) as client:
        assert client.predict(b"raw bytes") == b"raw bytes"
        client.set_timeout(1000)
        client.init()  # re-init with new settings keeps working
        assert client.predict("str") == b"str"
    assert len(server.predicts) == 2


async def test_async_context_manager(server: FakeEAS) -> None:
    from eas_sdk import AsyncPredictClient

    async with AsyncPredictClient(server.url, "echo", token=TOKEN) as client:
        assert await client.predict(b"raw") == b"raw"
    assert client._http is None


async def test_lazy_init_from_many_concurrent_calls(server: FakeEAS, make_client: Any) -> None:
    h = make_client(server.url, "echo", token=TOKEN)
    results = await asyncio.gather(*(h.predict(Raw(b"%d" % i)) for i in range(8)))
    assert sorted(results) == sorted(b"%d" % i for i in range(8))
    assert all(r.auth_ok for r in server.predicts)


async def test_library_adds_no_log_handlers(server: FakeEAS, make_client: Any) -> None:
    h = make_client(server.url, "echo", token=TOKEN)
    h.client.set_log_level(logging.DEBUG)
    try:
        await h.predict(Raw(b"x"))
        for name in ("eas_sdk", "eas_sdk.predict"):
            assert logging.getLogger(name).handlers == []
    finally:
        h.client.set_log_level(logging.NOTSET)


async def test_warns_when_raw_token_goes_over_plain_http_to_a_remote_host(
    make_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="eas_sdk")
    local = make_client(custom_url="http://127.0.0.1:1/api/predict/x", token=TOKEN)
    await local.init()
    assert not caplog.records
    remote = make_client(custom_url="http://example.invalid/api/predict/x", token=TOKEN)
    await remote.init()  # no connection is made at init
    assert "plain HTTP" in caplog.text and TOKEN not in caplog.text


def test_abandoned_sync_client_stops_its_discovery_thread(servers: Any) -> None:
    import gc
    import threading

    from eas_sdk import PredictClient

    disc, w = servers(), servers()
    disc.set_endpoints([_ep(w, 1)])
    client = PredictClient(disc.url, "gc_svc", endpoint_type=ENDPOINT_TYPE_DIRECT, discovery_interval=0.05)
    assert client.predict(b"x") == b"x"
    (thread,) = [t for t in threading.enumerate() if t.name == "eas-discovery-gc_svc"]
    del client
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


async def test_documented_setters_then_init(servers: Any, kind: str) -> None:
    """The eas-prediction documentation's call sequence, setter by setter, in direct mode."""
    from .conftest import Harness

    disc, worker = servers(), servers(tokens=[TOKEN])
    disc.set_endpoints([_ep(worker, 100)])
    h = Harness(kind)
    c = h.client
    c.set_endpoint(disc.url)
    c.set_service_name("echo")
    c.set_endpoint_type(ENDPOINT_TYPE_DIRECT)
    c.set_token(TOKEN)
    c.set_retry_count(2)
    c.set_max_connection_count(3)
    c.set_timeout(2000)
    c.set_content_type("application/json")
    c.set_log_level(logging.WARNING)
    c.add_extra_headers({"X-Extra": "e"})
    try:
        await h.init()
        assert await h.predict(Raw(b"{}")) == b"{}"
    finally:
        await h.close()
        c.set_log_level(logging.NOTSET)
    (rec,) = worker.predicts
    assert rec.auth_ok
    assert rec.headers["Content-Type"] == "application/json"
    assert rec.headers["X-Extra"] == "e"
    assert rec.headers["X-Eas-Deadline-Ms"] == "2000"
    assert c.retry_count == 2 and c.config.max_connection_count == 3
    with pytest.raises(TypeError):
        c.add_extra_headers([("a", "b")])
