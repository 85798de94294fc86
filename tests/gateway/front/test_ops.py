"""Admin, discovery, metrics, lifecycle and the header-phase deadline, against fake pools."""

from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
import pytest

from gateway.config import parse_config
from gateway.fronts.state import GATEWAY_KEY
from tests.gateway.front.fakes import TOKEN, close_writer, live_gateway, make_config
from tests.waiting import async_wait_until

pytestmark = pytest.mark.usefixtures("front")  # both listeners: see conftest.py


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        return r.status, await r.read()


async def test_healthz_readyz_and_services_listing() -> None:
    async with live_gateway() as gw:
        assert (await _get(gw.url + "/healthz"))[0] == 200
        status, body = await _get(gw.url + "/readyz")
        assert status == 200, body
        assert json.loads(body)["ready"] is True
        gw.pools["echo"].ready = False
        status, body = await _get(gw.url + "/readyz")
        assert status == 503
        assert json.loads(body)["services"]["echo"] is False
        assert (await _get(gw.url + "/readyz?service=echo"))[0] == 503
        assert (await _get(gw.url + "/readyz?service=digits"))[0] == 200
        assert (await _get(gw.url + "/readyz?service=nope"))[0] == 404
        # Liveness does not depend on workers.
        assert (await _get(gw.url + "/healthz"))[0] == 200
        status, body = await _get(gw.url + "/api/services")
        assert status == 200
        doc = json.loads(body)
        assert doc["gateway"]["pid"] == os.getpid()
        listing = {s["name"]: s for s in doc["services"]}
        assert set(listing) == {"digits", "echo", "other", "q"}
        assert listing["digits"]["workers"][0]["pid"] == 4242
        assert listing["echo"]["ready"] is False
        assert listing["q"]["queues"] == {"q": {"length": 3}, "q/sink": {"length": 3}}
        assert TOKEN not in body.decode()
        # Shutting down: readiness drops at once, liveness stays.
        gw.app[GATEWAY_KEY].state.shutting_down = True
        assert (await _get(gw.url + "/readyz"))[0] == 503
        assert (await _get(gw.url + "/readyz?service=digits"))[0] == 503
        assert (await _get(gw.url + "/healthz"))[0] == 200


async def test_unknown_route_is_json_404() -> None:
    async with live_gateway() as gw:
        status, body = await _get(gw.url + "/nothing/here")
        assert status == 404
        assert json.loads(body)["code"] == "NotFound"


async def test_lifecycle_starts_and_stops_pools_and_queues() -> None:
    async with live_gateway() as gw:
        assert all(p.started for p in gw.pools.values())
        assert gw.queues.started
        assert set(gw.pools) == {"digits", "echo", "other"}  # no pool for the plain queue
    assert all(p.stopped for p in gw.pools.values())
    assert not gw.queues.started


async def test_discovery_lists_ready_workers_of_one_service() -> None:
    async with live_gateway() as gw:
        for prefix in (
            "/api/v1/servicediscovery/upstreams/",
            "/exported/apis/eas.alibaba-inc.k8s.io/v1/upstreams/",
        ):
            status, body = await _get(gw.url + prefix + "digits")
            assert status == 200
            items = json.loads(body)["endpoints"]["items"]
            assert items == [{"ip": "127.0.0.1", "port": 9001, "weight": 100}]
            assert isinstance(items[0]["weight"], int)
            assert (await _get(gw.url + prefix + "nope"))[0] == 404
            assert (await _get(gw.url + prefix + "..%2Fx"))[0] == 400
        # The SDK-GO form with a query string and a sub path.
        status, body = await _get(
            gw.url + "/exported/apis/eas.alibaba-inc.k8s.io/v1/upstreams/echo?internal=false"
        )
        assert status == 200
        gw.pools["echo"].ready = False
        status, body = await _get(gw.url + "/api/v1/servicediscovery/upstreams/echo")
        assert json.loads(body)["endpoints"]["items"] == []
        # A queue service is served by the gateway itself.
        status, body = await _get(gw.url + "/api/v1/servicediscovery/upstreams/q")
        assert json.loads(body)["endpoints"]["items"] == [{"ip": "127.0.0.1", "port": gw.port, "weight": 100}]


async def test_discovery_can_require_the_token() -> None:
    async with live_gateway(discovery_requires_token=True) as gw:
        url = gw.url + "/api/v1/servicediscovery/upstreams/digits"
        assert (await _get(url))[0] == 401
        assert (await _get(url, {"Authorization": "wrong"}))[0] == 401
        assert (await _get(url, {"Authorization": TOKEN}))[0] == 200
        # Open services stay open.
        assert (await _get(gw.url + "/api/v1/servicediscovery/upstreams/echo"))[0] == 200


async def test_metrics_counts_known_services_only() -> None:
    async with live_gateway() as gw, aiohttp.ClientSession() as s:
        for _ in range(3):
            async with s.post(gw.url + "/api/predict/echo", data=b"x") as r:
                assert r.status == 200
        gw.pools["echo"].mode = "overloaded"
        async with s.post(gw.url + "/api/predict/echo", data=b"x") as r:
            assert r.status == 450
        for i in range(300):
            async with s.post(gw.url + f"/api/predict/bogus{i}", data=b"x") as r:
                assert r.status == 404
        async with s.get(gw.url + "/metrics") as r:
            assert r.status == 200
            text = await r.text()
    assert 'easgw_requests_total{service="echo",status="200"} 3.0' in text
    assert 'easgw_requests_total{service="echo",status="450"} 1.0' in text
    assert "easgw_unknown_service_requests_total 300.0" in text
    assert "bogus" not in text
    assert 'easgw_ready_workers{service="digits"} 1.0' in text
    assert 'easgw_worker_restarts_total{service="digits"} 0.0' in text
    assert 'easgw_queue_length{queue="q"} 3.0' in text
    assert "easgw_compute_seconds_count" in text
    assert len(text) < 1_000_000


def _gauge(text: str, name: str) -> float:
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


async def test_metrics_count_the_loop_tasks_and_the_process_figures() -> None:
    """What a soak watches for growth: the loop's tasks follow what it holds, and the
    process's memory and descriptors are there."""
    async with live_gateway() as gw, aiohttp.ClientSession() as s:

        async def scrape() -> str:
            async with s.get(gw.url + "/metrics") as r:
                assert r.status == 200
                return await r.text()

        before = _gauge(await scrape(), "easgw_asyncio_tasks")
        release = asyncio.Event()
        held = [asyncio.create_task(release.wait()) for _ in range(50)]
        during = await scrape()
        release.set()
        await asyncio.gather(*held)
        after = _gauge(await scrape(), "easgw_asyncio_tasks")
    assert _gauge(during, "easgw_asyncio_tasks") >= before + 50
    assert after < before + 50
    assert _gauge(during, "process_resident_memory_bytes") > 0
    assert _gauge(during, "process_open_fds") > 0


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the server hung up within ``seconds``: an end of stream, or a reset (what the
    kernel sends for a server that closes with bytes of the client's still unread)."""
    try:
        data = await asyncio.wait_for(reader.read(), seconds)
    except asyncio.TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return data == b""


async def test_header_deadline_closes_slow_and_idle_connections() -> None:
    async with live_gateway(header_timeout_s=0.4, keepalive_timeout_s=30.0) as gw:
        # Half a request line, then nothing.
        r1, w1 = await asyncio.open_connection("127.0.0.1", gw.port)
        w1.write(b"POST /api/pre")
        await w1.drain()
        # A connection that never sends anything.
        r2, w2 = await asyncio.open_connection("127.0.0.1", gw.port)
        # Headers trickling in, one byte at a time, never finished.
        r3, w3 = await asyncio.open_connection("127.0.0.1", gw.port)
        closed = asyncio.ensure_future(_closed_within(r3, 60.0))
        try:
            # A deadline each byte extended would never come: the trickle goes on until the
            # server hangs up, or gives up long after the header deadline.
            give_up = time.monotonic() + 10.0
            trickle_cut = False
            try:
                for ch in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " * 100:
                    if closed.done() or time.monotonic() > give_up:
                        break
                    w3.write(bytes([ch]))
                    await w3.drain()
                    await asyncio.sleep(0.02)  # the slow client's pace
            except ConnectionError:
                trickle_cut = True  # the server hung up mid-trickle
            assert trickle_cut or (closed.done() and closed.result()), "the trickle was never cut off"
            assert await _closed_within(r1, 10.0)
            assert await _closed_within(r2, 10.0)
        finally:
            closed.cancel()
            for w in (w1, w2, w3):
                await close_writer(w)
        # Normal requests are unaffected, including on a kept-alive connection used slowly.
        async with aiohttp.ClientSession() as s:
            for _ in range(2):
                async with s.get(gw.url + "/healthz") as r:
                    assert r.status == 200
                await asyncio.sleep(0.6)  # idle longer than header_timeout between requests
        # A keep-alive connection that starts a second request and stalls is closed too.
        r4, w4 = await asyncio.open_connection("127.0.0.1", gw.port)
        w4.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await w4.drain()
        first = await asyncio.wait_for(r4.readuntil(b'"ok"}'), 3.0)
        assert first.startswith(b"HTTP/1.1 200")
        w4.write(b"GET /heal")
        await w4.drain()
        assert await _closed_within(r4, 3.0)
        await close_writer(w4)


async def test_loopback_guard_and_bad_gateway_values_in_config() -> None:
    cfg = make_config()
    assert cfg.gateway.loopback_only  # conftest sets EASGW_LOOPBACK_ONLY
    raw = {"gateway": {"max_body_bytes": "lots"}, "services": []}
    try:
        parse_config(raw)
    except ValueError as exc:
        assert "gateway.max_body_bytes" in str(exc)
    else:
        raise AssertionError("config error not raised")


async def test_header_deadline_covers_a_partial_pipelined_head() -> None:
    async with live_gateway(header_timeout_s=0.4, keepalive_timeout_s=30.0) as gw:
        gw.pools["echo"].delay_s = 0.8  # the first request is still running when the deadline passes
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        try:
            writer.write(b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirst")
            await writer.drain()
            await async_wait_until(lambda: gw.pools["echo"].calls, 10, "the first request handled")
            writer.write(b"POST /api/predict/ec")
            await writer.drain()
            data = await asyncio.wait_for(reader.read(), 5.0)  # until the server closes
        finally:
            await close_writer(writer)
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"first"), data[-200:]
        assert len(gw.pools["echo"].calls) == 1
