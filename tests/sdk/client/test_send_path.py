"""PredictClient's per-call path: same headers and bytes as the straightforward way, fewer sends.

* build_headers (the per-config HeaderPlan) gives exactly what merging the extra
  headers with signed_headers/plain_headers gives, in the same order;
* a small request leaves in one send() (head + body), a large one in two, and the
  bytes on the wire are those plain urllib3 sends;
* the cached fixed-URL pool falls back to the pool manager when it was closed.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from email.utils import formatdate
from typing import Any

import pytest
import urllib3

from eas_sdk._core.auth import http_date, plain_headers, signed_headers
from eas_sdk._core.request import ClientConfig, build_headers, merge_headers
from eas_sdk.predict import COALESCE_MAX_BODY, PredictClient, _HTTPConnection

from .conftest import TOKEN, Raw
from .fake_eas import FakeEAS

pytestmark = pytest.mark.timeout(30)

DATE = "Sun, 22 Nov 2026 01:42:15 GMT"


def _reference_headers(cfg: ClientConfig, body: bytes, rid: str, deadline_ms: int | None) -> dict[str, str]:
    """build_headers written the plain way (one merge of two dicts)."""
    extra = dict(cfg.headers)
    ctype = cfg.content_type or next(
        (v for k, v in extra.items() if k.lower() == "content-type" and v), "application/octet-stream"
    )
    if cfg.token and cfg.custom_url:
        ours = plain_headers(cfg.token, ctype, DATE)
    elif cfg.token:
        ours = signed_headers(cfg.token, body, cfg.service_name, ctype, DATE)
    else:
        ours = {"Content-Type": ctype}
    if not any(k.lower() == "x-request-id" for k in extra):
        ours["X-Request-Id"] = rid
    if deadline_ms is not None:
        ours["X-Eas-Deadline-Ms"] = str(max(1, deadline_ms))
    return merge_headers(extra, ours)


EXTRAS = [
    (),
    (("X-A", "1"), ("x-a", "2")),
    (("authorization", "user"), ("X-REQUEST-ID", "mine"), ("content-type", "a/b")),
    (("X-Eas-Deadline-Ms", "7"), ("Date", "then"), ("Content-MD5", "m"), ("Keep", "me")),
    (("Content-Type", ""),),
]


@pytest.mark.parametrize("extra", EXTRAS)
@pytest.mark.parametrize("mode", ["signed", "plain", "anonymous"])
@pytest.mark.parametrize("deadline_ms", [None, 0, 2500])
def test_build_headers_equals_the_plain_merge(extra: Any, mode: str, deadline_ms: int | None) -> None:
    cfg = ClientConfig(
        endpoint="h",
        service_name="svc/sub",
        custom_url="http://u/p?q=1" if mode == "plain" else "",
        token="" if mode == "anonymous" else "dG9rZW4xMjM=",
        headers=extra,
        content_type="c/t" if extra == () and mode == "signed" else "",
    )
    for body in (b"", b"hello"):
        got = build_headers(cfg, body, request_id="rid", deadline_ms=deadline_ms, date=DATE)
        want = _reference_headers(cfg, body, "rid", deadline_ms)
        assert list(got.items()) == list(want.items())
        again = build_headers(cfg, body, request_id="rid", deadline_ms=deadline_ms, date=DATE)
        assert again == got and again is not got  # a fresh dict every attempt


def test_http_date_is_the_current_second() -> None:
    for _ in range(3):
        before = int(time.time())
        text = http_date()
        after = int(time.time())
        assert text in {formatdate(t, usegmt=True) for t in range(before, after + 1)}
    assert http_date(0) == "Thu, 01 Jan 1970 00:00:00 GMT"


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """Every send() that reaches http.client (what becomes one sendall)."""
    sent: list[bytes] = []
    original = http.client.HTTPConnection.send

    def spy(self: http.client.HTTPConnection, data: Any) -> None:
        sent.append(bytes(data))
        original(self, data)

    monkeypatch.setattr(http.client.HTTPConnection, "send", spy)
    yield sent


def _exchange(
    conn: http.client.HTTPConnection, sent: list[bytes], body: bytes, headers: dict[str, str]
) -> list[bytes]:
    sent.clear()
    conn.request("POST", "/api/predict/echo", body=body, headers=headers)  # type: ignore[call-arg]
    resp = conn.getresponse()
    data = resp.data  # urllib3 preloads the body
    assert resp.status == 200
    if headers.get("Transfer-Encoding") != "chunked":
        assert data == body
    return list(sent)


@pytest.mark.parametrize(
    ("size", "headers", "ours_sends"),
    [
        (5, {}, 1),
        (COALESCE_MAX_BODY, {}, 1),
        (COALESCE_MAX_BODY + 1, {}, 2),
        (5, {"Transfer-Encoding": "chunked"}, 3),  # head, chunk, last chunk: nothing merged
    ],
)
def test_connection_sends_the_same_bytes_in_fewer_sends(
    open_server: FakeEAS, sends: list[bytes], size: int, headers: dict[str, str], ours_sends: int
) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    headers = {"X-Request-Id": "r", **headers}
    plain = urllib3.connection.HTTPConnection("127.0.0.1", open_server.port)
    ours = _HTTPConnection("127.0.0.1", open_server.port)
    try:
        for _ in range(2):  # a fresh connection, then a kept-alive one
            want = _exchange(plain, sends, body, headers)
            got = _exchange(ours, sends, body, headers)
            assert b"".join(got) == b"".join(want)
            assert len(got) == ours_sends
            assert len(want) == (3 if "Transfer-Encoding" in headers else 2)
    finally:
        plain.close()
        ours.close()
    assert [r.body for r in open_server.predicts][-1] == body


def test_small_predict_is_one_send_and_a_large_one_still_works(server: FakeEAS, sends: list[bytes]) -> None:
    with PredictClient(server.url, "echo", token=TOKEN) as client:
        sends.clear()
        assert client.predict(Raw(b"hello")) == b"hello"
        assert len(sends) == 1 and sends[0].startswith(b"POST /api/predict/echo ")
        assert sends[0].endswith(b"\r\n\r\nhello")
        big = b"y" * (COALESCE_MAX_BODY * 2)
        sends.clear()
        assert client.predict(Raw(big)) == big
        assert len(sends) == 2 and sends[1] == big
    assert [r.auth_ok for r in server.predicts] == [True, True]


def test_closed_cached_pool_falls_back_to_the_manager(server: FakeEAS) -> None:
    client = PredictClient(server.url, "echo", token=TOKEN)
    try:
        client.init()
        assert client.predict(Raw(b"one")) == b"one"
        assert client._route is not None
        client._pool.clear()  # what close() does, as if it ran in another thread meanwhile
        assert client.predict(Raw(b"two")) == b"two"
        assert [r.body for r in server.predicts] == [b"one", b"two"]  # nothing sent twice
    finally:
        client.close()
