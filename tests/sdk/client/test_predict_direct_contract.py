"""Contract suite, direct mode, secrets and the API surface: every test runs against
PredictClient (sync) and AsyncPredictClient, with real aiohttp servers on 127.0.0.1 as
the workers and the discovery endpoint.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from eas_sdk import ENDPOINT_TYPE_DIRECT, ENDPOINT_TYPE_VIPSERVER
from eas_sdk.errors import (
    AuthenticationError,
    NoEndpointError,
    PredictException,
)
from tests.waiting import async_wait_until

from .conftest import FAST, TOKEN, Raw, endpoint_item
from .fake_eas import Drop, FakeEAS, Reply

pytestmark = pytest.mark.timeout(30)


# --- direct mode ------------------------------------------------------------


async def test_direct_mode_follows_weights(servers: Any, make_client: Any) -> None:
    disc, a, b = servers(), servers(tokens=[TOKEN]), servers(tokens=[TOKEN])
    disc.set_endpoints([endpoint_item(a, 1), endpoint_item(b, 3)])
    h = make_client(disc.url, "echo", token=TOKEN, endpoint_type=ENDPOINT_TYPE_DIRECT)
    for i in range(40):
        assert await h.predict(Raw(b"%d" % i)) == b"%d" % i
    share_a = len(a.predicts) / 40
    assert 0.2 <= share_a <= 0.3
    assert len(a.predicts) + len(b.predicts) == 40


async def test_direct_mode_fails_over_to_an_untried_endpoint(servers: Any, make_client: Any) -> None:
    disc, bad, good = servers(), servers(tokens=[TOKEN]), servers(tokens=[TOKEN])
    bad.default = Reply(503)
    disc.set_endpoints([endpoint_item(bad, 1), endpoint_item(good, 1)])
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
    disc.set_endpoints([endpoint_item(w, 1)])
    h = make_client(
        disc.url, "echo", token=TOKEN, endpoint_type=ENDPOINT_TYPE_DIRECT, discovery_interval=0.05
    )
    assert await h.predict(Raw(b"1")) == b"1"
    disc.discovery = lambda: (500, b"boom")
    hits = len(disc.discovery_hits)
    await async_wait_until(lambda: len(disc.discovery_hits) >= hits + 4, 10, "failed discovery rounds")
    disc.stop()  # now connections are refused as well
    for i in range(5):
        assert await h.predict(Raw(b"%d" % i)) == b"%d" % i
        await asyncio.sleep(0.05)  # calls spread over more failed discovery rounds
    warnings = [r for r in caplog.records if r.name.startswith("eas_sdk") and r.levelno >= logging.WARNING]
    assert len(warnings) == 1  # rate-limited: one per 30 s
    assert "keeping 1 known endpoints" in warnings[0].getMessage()


async def test_direct_mode_stops_using_a_removed_endpoint(servers: Any, make_client: Any) -> None:
    disc, a, b = servers(), servers(tokens=[TOKEN]), servers(tokens=[TOKEN])
    disc.set_endpoints([endpoint_item(a, 1), endpoint_item(b, 1)])
    h = make_client(
        disc.url, "echo", token=TOKEN, endpoint_type=ENDPOINT_TYPE_DIRECT, discovery_interval=0.05
    )
    for i in range(4):
        await h.predict(Raw(b"%d" % i))
    assert a.predicts and b.predicts
    disc.set_endpoints([endpoint_item(b, 1)])
    hits = len(disc.discovery_hits)
    await async_wait_until(
        lambda: len(disc.discovery_hits) >= hits + 2, 10, "a discovery round after the change"
    )
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
    await async_wait_until(lambda: h.client.endpoints.ready, 10, "an (empty) endpoint list")
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
    with pytest.raises(NoEndpointError, match="timeout"):  # not a call left hanging
        await h.predict(Raw(b"x"))
    # Rounds keep coming: each hung one was abandoned.
    await async_wait_until(lambda: len(disc.discovery_hits) >= 3, 10, "three discovery rounds")


async def test_hanging_discovery_keeps_the_last_endpoints(servers: Any, make_client: Any) -> None:
    disc, w = servers(), servers(tokens=[TOKEN])
    disc.set_endpoints([endpoint_item(w, 1)])
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
    i = 0

    async def hung_rounds_while_calls_succeed() -> bool:
        nonlocal i
        i += 1
        assert await h.predict(Raw(b"%d" % i)) == b"%d" % i
        return len(disc.discovery_hits) >= hits + 3  # each hung round gave up after 0.2 s

    await async_wait_until(hung_rounds_while_calls_succeed, 10, "three hung discovery rounds", poll_s=0.05)
    await asyncio.wait_for(h.close(), 10)  # closing does not wait on a hung round


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
    disc.set_endpoints([endpoint_item(w, 1)])
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
    disc.set_endpoints([endpoint_item(worker, 100)])
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
