"""Contract suite, signing and retries: every test runs against PredictClient (sync) and
AsyncPredictClient.

A real aiohttp server on 127.0.0.1 verifies the EAS signatures with
gateway.core.auth.verify and answers scripted statuses; attempts are counted on the
server side.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from eas_sdk import ENDPOINT_TYPE_DIRECT
from eas_sdk._core.auth import content_md5
from eas_sdk._core.retry import RetryPolicy
from eas_sdk.errors import (
    AuthenticationError,
    BadRequestError,
    ClientHTTPError,
    GatewayTimeoutError,
    NotFoundError,
    PayloadTooLargeError,
    PredictException,
    QueueFullError,
    ServerHTTPError,
    ServiceUnavailableError,
    TooManyRequestsError,
)

from .conftest import FAST, TOKEN, Raw
from .fake_eas import FakeEAS, Reply

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
