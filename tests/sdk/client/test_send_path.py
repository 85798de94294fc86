"""PredictClient's per-call path: same headers and bytes as the straightforward way, fewer sends.

* build_headers (the per-config HeaderPlan) gives exactly what merging the extra
  headers with signed_headers/plain_headers gives, in the same order;
* a small request leaves in one send() (head + body), a large one as head then body,
  and the bytes on the wire are the request line, Host, the headers, Content-Length;
* closing the pool while the client is in use keeps the client usable.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from email.utils import formatdate
from typing import Any

import pytest

from eas_sdk._core.auth import http_date, plain_headers, signed_headers
from eas_sdk._core.request import ClientConfig, build_headers, merge_headers
from eas_sdk._transports import HTTPTransport, Request
from eas_sdk.predict import COALESCE_MAX_BODY, PredictClient
from tests.sdk.socket_server import ThreadedServer

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


class RecordingServer(ThreadedServer):
    """Keep-alive HTTP/1.1 echo server that records every chunk ``recv`` returned per request."""

    def __init__(self) -> None:
        self.requests: list[tuple[bytes, int]] = []  # (raw request bytes, recv calls it took)
        super().__init__()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                raw, reads = b"", 0
                while b"\r\n\r\n" not in raw:
                    chunk = conn.recv(1 << 20)
                    if not chunk:
                        return
                    raw, reads = raw + chunk, reads + 1
                head, _, body = raw.partition(b"\r\n\r\n")
                length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
                while len(body) < length:
                    time.sleep(0.001)  # let a second send arrive as its own segment
                    body += conn.recv(1 << 20)
                    reads += 1
                self.requests.append((head + b"\r\n\r\n" + body, reads))
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


@pytest.fixture
def recording() -> Iterator[RecordingServer]:
    srv = RecordingServer()
    yield srv
    srv.close()


@pytest.mark.parametrize("size", [5, COALESCE_MAX_BODY, COALESCE_MAX_BODY + 1, 3 * COALESCE_MAX_BODY])
def test_request_bytes_are_head_then_body(recording: RecordingServer, size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    transport = HTTPTransport()
    url = f"http://127.0.0.1:{recording.port}/api/predict/echo?a=1"
    try:
        for _ in range(2):  # a fresh connection, then a kept-alive one
            resp = transport.handle_request(Request("POST", url, {"X-Request-Id": "r"}, body, 5.0))
            assert (resp.status, resp.body) == (200, body)
    finally:
        transport.close()
    want = (
        b"POST /api/predict/echo?a=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-Request-Id: r\r\n"
        b"Content-Length: %d\r\n\r\n" % (recording.port, size)
    ) + body
    assert [raw for raw, _ in recording.requests] == [want, want]


def test_small_predict_is_one_send_and_a_large_one_still_works(recording: RecordingServer) -> None:
    with PredictClient(f"127.0.0.1:{recording.port}", "echo", token=TOKEN) as client:
        assert client.predict(Raw(b"hello")) == b"hello"
        big = b"y" * (COALESCE_MAX_BODY * 2)
        assert client.predict(Raw(big)) == big
    (small, reads), (large, _) = recording.requests
    assert reads == 1 and small.startswith(b"POST /api/predict/echo ") and small.endswith(b"\r\n\r\nhello")
    assert large.endswith(big)


def test_close_during_use_keeps_the_client_usable(server: FakeEAS) -> None:
    client = PredictClient(server.url, "echo", token=TOKEN)
    try:
        client.init()
        assert client.predict(Raw(b"one")) == b"one"
        assert client._http is not None
        client._http.close()  # what close() does, as if it ran in another thread meanwhile
        assert client.predict(Raw(b"two")) == b"two"
        assert [r.body for r in server.predicts] == [b"one", b"two"]  # nothing sent twice
    finally:
        client.close()
