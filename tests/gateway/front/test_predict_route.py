"""The predict route against fake pools: statuses, limits, auth, pass-through, request ids."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import aiohttp
import pytest
from multidict import CIMultiDict

from eas_sdk._core.auth import signed_headers
from gateway.fronts.state import GATEWAY_KEY
from tests.gateway.front.fakes import (
    OTHER_TOKEN,
    TOKEN,
    FakeWorkerRequest,
    close_writer,
    live_gateway,
    raw_request,
)
from tests.waiting import async_wait_until

pytestmark = pytest.mark.usefixtures("front")  # both listeners: see conftest.py


async def _post(
    url: str, data: bytes = b"x", headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict]:
    async with aiohttp.ClientSession() as s, s.post(url, data=data, headers=headers) as r:
        return r.status, await r.read(), CIMultiDict(r.headers)


def _err(body: bytes) -> dict:
    out = json.loads(body)
    assert set(out) == {"code", "message", "request_id"}
    assert "Traceback" not in out["message"]
    return out


async def test_echo_passthrough_and_request_id() -> None:
    async with live_gateway() as gw:
        status, body, headers = await _post(
            gw.url + "/api/predict/echo", b"\x00\x01hello", {"Content-Type": "application/x-test"}
        )
        assert status == 200
        assert body == b"\x00\x01hello"
        assert headers["Content-Type"] == "application/x-test"
        assert re.fullmatch(r"[0-9a-f]{32}", headers["X-Request-Id"])
        req, timeout = gw.pools["echo"].calls[-1]
        assert isinstance(req, FakeWorkerRequest)
        assert req.request_id == headers["X-Request-Id"]
        assert timeout == pytest.approx(5.0)
        # A sane incoming id is kept, a hostile one replaced.
        _, _, h = await _post(gw.url + "/api/predict/echo", headers={"X-Request-Id": "abc-123.x:y"})
        assert h["X-Request-Id"] == "abc-123.x:y"
        _, _, h = await _post(gw.url + "/api/predict/echo", headers={"X-Request-Id": "a b<script>"})
        assert h["X-Request-Id"] != "a b<script>"
        assert re.fullmatch(r"[0-9a-f]{32}", h["X-Request-Id"])


async def test_subpath_and_headers_forwarded_without_credentials() -> None:
    async with live_gateway() as gw:
        hdrs = signed_headers(TOKEN, b"abc", "digits/v1/run")
        hdrs["X-Eas-Request-Format"] = "tf"
        status, _, _ = await _post(gw.url + "/api/predict/digits/v1/run", b"abc", hdrs)
        assert status == 200
        req, _ = gw.pools["digits"].calls[-1]
        assert req.subpath == "v1/run"
        assert req.headers.get("X-Eas-Request-Format") == "tf"
        lowered = {k.lower() for k in req.headers}
        assert not lowered & {"authorization", "content-md5", "date", "host"}


async def test_unknown_service_is_404() -> None:
    async with live_gateway() as gw:
        status, body, headers = await _post(gw.url + "/api/predict/nope")
        assert status == 404
        err = _err(body)
        assert err["code"] == "ServiceNotFound"
        assert err["request_id"] == headers["X-Request-Id"]


@pytest.mark.parametrize(
    "path",
    [
        b"/api/predict/..%2F..%2Fetc%2Fpasswd",
        b"/api/predict/%2e%2e",
        b"/api/predict/echo%00",
        b"/api/predict/echo%0d%0aX-Injected:%201",
        b"/api/predict/" + b"a" * 65,
        b"/api/predict/caf%C3%A9",
        b"/api/predict/caf\xc3\xa9",
        b"/api/predict/",
        b"/api/predict/.hidden",
    ],
)
async def test_hostile_service_names_are_400(path: bytes) -> None:
    async with live_gateway() as gw:
        raw = await raw_request(
            gw.port,
            b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
        )
        head, _, body = raw.partition(b"\r\n\r\n")
        assert re.match(rb"HTTP/1\.[01] 400 ", head), raw[:200]
        assert b"X-Injected" not in head
        # Raw non-ASCII bytes are already refused by the HTTP parser (BadRequest).
        assert _err(body)["code"] in ("InvalidServiceName", "BadRequest")
        assert not any(p.calls for p in gw.pools.values())


async def test_wrong_method_is_405_with_allow() -> None:
    async with live_gateway() as gw, aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/api/predict/echo") as r:
            assert r.status == 405
            assert r.headers["Allow"] == "POST"
            assert _err(await r.read())["code"] == "MethodNotAllowed"


async def test_content_length_over_limit_is_413_before_reading() -> None:
    async with live_gateway(max_body_bytes=1024) as gw:
        # Announce 100 MB, send none of it: the answer must come without the body.
        raw = await raw_request(
            gw.port,
            b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n",
        )
        assert raw.startswith(b"HTTP/1.1 413"), raw[:200]
        assert _err(raw.partition(b"\r\n\r\n")[2])["code"] == "PayloadTooLarge"
        assert not gw.pools["echo"].calls


async def test_chunked_body_over_limit_is_413() -> None:
    async with live_gateway(max_body_bytes=1024) as gw:
        chunk = b"a" * 600
        data = (
            b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 3
            + b"0\r\n\r\n"
        )
        raw = await raw_request(gw.port, data)
        assert raw.startswith(b"HTTP/1.1 413"), raw[:200]
        assert not gw.pools["echo"].calls
        # Under the limit, chunked works.
        small = b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        small += b"Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        raw = await raw_request(gw.port, small)
        assert raw.startswith(b"HTTP/1.1 200")
        assert raw.endswith(b"hello")


async def test_slow_body_is_408_and_closed() -> None:
    """One body_timeout_s from the head, on both listeners (the lean front used to wait one
    timeout, then hand the connection to aiohttp, which waited a second one)."""
    async with live_gateway(body_timeout_s=1.0) as gw:
        for path in ("/api/predict/echo", "/api/predict/q"):  # a predict and a queue put
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            t0 = time.monotonic()
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {TOKEN}\r\nContent-Length: 100\r\n\r\n"
            writer.write(head.encode() + b"abc")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 5.0)
            elapsed = time.monotonic() - t0
            data = line + await asyncio.wait_for(reader.read(), 5.0)  # until the server closes
            await close_writer(writer)
            assert data.startswith(b"HTTP/1.1 408"), data[:200]
            assert b"\r\nConnection: close\r\n" in data
            assert _err(data.partition(b"\r\n\r\n")[2])["code"] == "RequestTimeout"
            # After one body timeout (a timer never fires early), and before a second one
            # would have run out: a whole body timeout of slack for a loaded machine. (Either
            # front's 408 is aiohttp's, so nothing but the time tells one wait from two.)
            assert 0.9 < elapsed < 2.0, elapsed
        assert not gw.pools["echo"].calls
        assert not gw.queues.handled
        rendered = gw.app[GATEWAY_KEY].metrics.render()
        assert b'easgw_requests_total{service="echo",status="408"} 1.0' in rendered


async def test_slow_body_still_arriving_is_read_and_dropped_after_the_408() -> None:
    """The 408 comes while the client still sends; what it sends next is read and dropped
    (lingering close), so the client reads the answer rather than a reset."""
    async with live_gateway(body_timeout_s=0.3) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 300000\r\n\r\nabc")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 3.0)
        assert line.startswith(b"HTTP/1.1 408"), line
        writer.write(b"z" * 299_997)  # the rest of the body, after the answer
        await writer.drain()
        assert (await asyncio.wait_for(reader.read(), 5.0)).endswith(b"}")
        await close_writer(writer)


@pytest.mark.parametrize(
    ("service", "auth"),
    [("digits", None), ("digits", "wrong-token"), ("digits", OTHER_TOKEN), ("q", None), ("q", "nope")],
)
async def test_missing_or_wrong_raw_token_is_401_before_the_body(service: str, auth: str | None) -> None:
    """No body can make such a request pass: it is answered at once, not after the upload
    (or the body timeout). An EAS signature needs the body (its MD5), so it waits."""
    # A body timeout far past how long the answer is waited for: a 401 that came only once
    # the body timed out would not come at all.
    async with live_gateway(body_timeout_s=60.0) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        head = f"POST /api/predict/{service} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
        if auth is not None:
            head += f"Authorization: {auth}\r\n"
        writer.write(head.encode() + b"\r\nabc")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 5.0)
        assert line.startswith(b"HTTP/1.1 401"), line
        writer.write(b"z" * 97)  # the rest, after the answer: read and dropped
        await writer.drain()
        head_rest = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
        length = int(re.search(rb"Content-Length: (\d+)", head_rest).group(1))  # type: ignore[union-attr]
        err = await asyncio.wait_for(reader.readexactly(length), 5.0)
        await close_writer(writer)
        assert _err(err)["code"] == "Unauthorized"
        assert not gw.pools["digits"].calls and not gw.queues.handled
        # The right raw token and a signature wait for the body, then pass.
        body = b"y" * 100
        for headers in ({"Authorization": TOKEN}, signed_headers(TOKEN, body, service)):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            lines = [
                f"POST /api/predict/{service} HTTP/1.1",
                "Host: x",
                "Content-Length: 100",
                "Connection: close",
            ]
            lines += [f"{k}: {v}" for k, v in headers.items()]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body[:3])
            await writer.drain()
            await asyncio.sleep(0.3)  # the client sends the rest of its body late
            writer.write(body[3:])
            data = await asyncio.wait_for(reader.read(), 5.0)
            await close_writer(writer)
            assert data.startswith(b"HTTP/1.1 200"), data[:200]


async def test_content_encoding_is_refused() -> None:
    async with live_gateway() as gw:
        status, body, _ = await _post(gw.url + "/api/predict/echo", b"x", {"Content-Encoding": "gzip"})
        assert status == 415
        assert _err(body)["code"] == "UnsupportedMediaType"


async def test_auth_matrix() -> None:
    url_path = "/api/predict/digits"
    async with live_gateway() as gw:
        url = gw.url + url_path
        body = b"payload"
        assert (await _post(url, body))[0] == 401
        assert (await _post(url, body, {"Authorization": "wrong"}))[0] == 401
        assert (await _post(url, body, {"Authorization": OTHER_TOKEN}))[0] == 401
        assert (await _post(url, body, {"Authorization": TOKEN}))[0] == 200
        assert (await _post(url, body, signed_headers(TOKEN, body, "digits")))[0] == 200
        # Signature for another service's path.
        assert (await _post(url, body, signed_headers(TOKEN, body, "echo")))[0] == 401
        # Body changed after signing: the signature holds, the MD5 does not.
        status, err, _ = await _post(url, b"tampered", signed_headers(TOKEN, body, "digits"))
        assert status == 400
        assert _err(err)["code"] == "BadDigest"
        for garbage in ("EAS", "EAS ", "EAS  x", "EAS !!!notbase64", "Bearer " + OTHER_TOKEN, "x" * 10_000):
            status, err, _ = await _post(url, body, {"Authorization": garbage})
            assert status in (400, 401), garbage[:20]
            if status == 401:
                assert _err(err)["code"] == "Unauthorized"
        assert len(gw.pools["digits"].calls) == 2
        # The same token as KServe's and Triton's clients send it.
        assert (await _post(url, body, {"Authorization": "Bearer " + TOKEN}))[0] == 200
        # Non-ASCII bytes in the header (sent raw): 401, never 500.
        raw = await raw_request(
            gw.port,
            b"POST /api/predict/digits HTTP/1.1\r\nHost: x\r\nAuthorization: EAS \xff\xfe\xc3\xa9\r\n"
            b"Content-Length: 1\r\nConnection: close\r\n\r\nx",
        )
        assert raw.startswith(b"HTTP/1.1 401"), raw[:100]
        # Service A's token never opens service B.
        assert (await _post(gw.url + "/api/predict/other", body, {"Authorization": TOKEN}))[0] == 401
        assert (await _post(gw.url + "/api/predict/other", body, {"Authorization": OTHER_TOKEN}))[0] == 200


@pytest.mark.parametrize(
    ("mode", "status", "code", "retry_after"),
    [
        ("overloaded", 450, "TooManyPending", True),
        ("noready", 503, "ServiceNotReady", True),
        ("timeout", 504, "UpstreamTimeout", False),
        ("crash", 500, "InternalError", False),
    ],
)
async def test_pool_errors_map_to_statuses(mode: str, status: int, code: str, retry_after: bool) -> None:
    async with live_gateway() as gw:
        gw.pools["echo"].mode = mode
        got, body, headers = await _post(gw.url + "/api/predict/echo")
        assert got == status
        err = _err(body)
        assert err["code"] == code
        assert "boom" not in err["message"]
        assert ("Retry-After" in headers) is retry_after
        # The gateway keeps serving.
        gw.pools["echo"].mode = "echo"
        assert (await _post(gw.url + "/api/predict/echo"))[0] == 200


async def test_worker_status_passes_through() -> None:
    async with live_gateway() as gw:
        gw.pools["echo"].status = 400
        status, body, _ = await _post(gw.url + "/api/predict/echo", b"bad input")
        assert (status, body) == (400, b"bad input")


async def test_deadline_header() -> None:
    async with live_gateway() as gw:
        status, body, _ = await _post(gw.url + "/api/predict/echo", headers={"X-Eas-Deadline-Ms": "3"})
        assert status == 408
        assert _err(body)["code"] == "DeadlineExceeded"
        assert not gw.pools["echo"].calls
        sent = time.monotonic()
        assert (await _post(gw.url + "/api/predict/echo", headers={"X-Eas-Deadline-Ms": "1200"}))[0] == 200
        took = time.monotonic() - sent
        # The client's 1.2 s, less what the call had spent before the dispatch (at most all
        # the call took, however slow the machine).
        assert 1.2 - took <= gw.pools["echo"].calls[-1][1] <= 1.2
        # A larger deadline never extends the service timeout.
        assert (await _post(gw.url + "/api/predict/echo", headers={"X-Eas-Deadline-Ms": "99999"}))[0] == 200
        assert gw.pools["echo"].calls[-1][1] == pytest.approx(5.0)
        assert (await _post(gw.url + "/api/predict/echo", headers={"X-Eas-Deadline-Ms": "soon"}))[0] == 400


async def test_client_disconnect_cancels_dispatch() -> None:
    async with live_gateway() as gw:
        pool = gw.pools["echo"]
        pool.delay_s = 3.0
        with pytest.raises(asyncio.TimeoutError):
            async with aiohttp.ClientSession() as s:
                await s.post(
                    gw.url + "/api/predict/echo", data=b"x", timeout=aiohttp.ClientTimeout(total=0.3)
                )
        answered_499 = b'easgw_requests_total{service="echo",status="499"} 1.0'
        await async_wait_until(
            lambda: pool.cancelled and answered_499 in gw.app[GATEWAY_KEY].metrics.render(),
            10,
            "the dispatch cancelled and the call counted as 499",
        )
        assert len(pool.calls) == 1
        assert pool.completed == 0
        assert b"\neasgw_inflight_requests 0.0\n" in gw.app[GATEWAY_KEY].metrics.render()


async def test_queue_services_go_to_queue_manager_after_auth() -> None:
    async with live_gateway() as gw:
        url = gw.url + "/api/predict/q"
        assert (await _post(url, b"item"))[0] == 401
        assert (await _post(url, b"item", {"Authorization": "nope"}))[0] == 401
        assert not gw.queues.handled
        status, body, headers = await _post(url, b"item", {"Authorization": TOKEN})
        assert (status, body) == (200, b"7")
        assert headers["X-Eas-Queueservice-Request-Id"] == "rid-1"
        assert gw.queues.handled[-1] == ("POST", "q", b"item")
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/sink?_length_=1", headers={"Authorization": TOKEN}) as r:
                assert r.status == 200
            async with s.get(url + "/elsewhere", headers={"Authorization": TOKEN}) as r:
                assert r.status == 404
        assert gw.queues.handled[-1] == ("GET", "q/sink", None)


_HEAD = b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nAuthorization: " + TOKEN.encode() + b"\rX: y\r\n\r\n",
        b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nX-Fold: a\r\n  b\r\nAuthorization: " + TOKEN.encode()
        + b"\r\n\r\n",
        b"POST /api/predict/echo HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        _HEAD + b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        _HEAD + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nx",
        b"POST /api/predict/caf\xc3\xa9 HTTP/1.1\r\nHost: x\r\nAuthorization: " + TOKEN.encode()
        + b"\r\n\r\n",
    ],
)  # fmt: skip
async def test_parser_rejections_are_json_400_and_quiet(
    request_bytes: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    async with live_gateway() as gw:
        raw = await raw_request(gw.port, request_bytes)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert re.match(rb"HTTP/1\.[01] 400 ", head), raw[:200]
    assert _err(body)["code"] == "BadRequest"
    assert not gw.pools["echo"].calls
    assert TOKEN not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(("path", "status"), [("/api/predict/nope", 404), ("/api/predict/digits", 401)])
async def test_early_answer_survives_a_client_that_uploads_first(path: str, status: int) -> None:
    """The answer comes before the body is read; the body is then drained (lingering close),
    so a client that writes its whole body before reading (urllib3) still reads the answer
    instead of a connection reset."""
    body = b"z" * (24 << 20)  # far more than the socket buffers hold
    async with live_gateway(max_body_bytes=64 << 20) as gw:
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            try:
                head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                writer.write(head + body)
                await writer.drain()
                line = await asyncio.wait_for(reader.readline(), 5.0)
            finally:
                await close_writer(writer)
            assert line.startswith(b"HTTP/1.1 %d" % status), line
