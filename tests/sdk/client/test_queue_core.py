"""The I/O-free queue core builds exactly the URLs and headers the reference client sends,
and the client retries only what the reference client retries."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eas_sdk._core import queue as core
from eas_sdk.errors import BadRequestError
from eas_sdk.queue import QueueClient
from tests.eas_reference import run_reference

REFERENCE_URLS = r"""
import json
from eas_prediction import QueueClient
c = QueueClient('127.0.0.1:9', 'mysvc.qservice/sink'); c.init(uid='uid-1', gid='gid-1')
out = {
  'put': c._build_url({'a': '1', 'b': 'x y'}),
  'get': c._build_url({'_index_': '5', '_length_': '2', '_timeout_': '10s', '_raw_': 'false',
                       '_auto_delete_': 'false', 'requestId': 'req-abc', 't': 'v'}),
  'delete': c._build_url({'_indexes_': ','.join(['1', '2', '3'])}),
  'truncate': c._build_url({'_index_': 43, '_trunc_': 'true'}),
  'watch': c._build_url({'_watch_': 'true', '_index_': 0, '_window_': 5, '_index_only_': 'false',
                         '_auto_commit_': 'true', 'tag': 'x'}, websocket=True),
  'headers': c._with_identity(),
}
print(json.dumps(out))
"""


@pytest.mark.compat
def test_urls_match_reference_client() -> None:
    ref = json.loads(run_reference(REFERENCE_URLS).stdout)
    base = core.base_url("127.0.0.1:9", "mysvc.qservice/sink")
    assert core.build_url(base, {"a": "1", "b": "x y"}) == ref["put"]
    get_q = core.get_query("req-abc", 5, 2, "10s", False, {"t": "v"})
    assert core.build_url(base, get_q) == ref["get"]
    assert core.build_url(base, core.indexes_query(core.index_list([1, 2, 3]))) == ref["delete"]
    assert core.build_url(base, core.truncate_query(43)) == ref["truncate"]
    watch_q = core.watch_query(0, 5, False, True, {"tag": "x"})
    assert core.build_url(base, watch_q, websocket=True) == ref["watch"]
    headers = core.identity_headers("", "uid-1", "gid-1")
    assert {k: v for k, v in ref["headers"].items() if k in headers} == headers


def test_core_rules() -> None:
    assert core.base_url("http://h:1/", "q", path_suffix="sink") == "http://h:1/api/predict/q/sink"
    assert core.base_url("h:1", "q", custom_url="https://x/y") == "https://x/y"
    assert core.build_url("https://x/y?a=1", {"b": "2"}, websocket=True) == "wss://x/y?a=1&b=2"
    assert [core.check_index(i) for i in (1, "7", 0, -1, "x", "1.5", True, 2.0)] == [
        True, True, False, False, False, False, False, True
    ]  # fmt: skip
    with pytest.raises(BadRequestError):
        core.index_list([1, "a"])
    with pytest.raises(BadRequestError):
        core.check_tags({"_reserved": "x"})
    assert core.duration_seconds("1m30s") == 90 and core.duration_seconds("500ms") == 0.5
    frames = core.parse_get(b"")
    assert frames == []
    assert core.parse_put(b"12", {"x-eas-queueservice-request-id": "r"}) == ("12", "r")


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.text(alphabet="ab_,.~-% +/=&é1", min_size=1, max_size=6),
        st.one_of(st.text(alphabet="09,az_.~- %&é", max_size=12), st.integers(0, 10**12)),
        max_size=4,
    )
)
def test_query_strings_are_written_as_urlencode_writes_them(query: dict[str, str | int]) -> None:
    assert core.build_url("http://h/q", query) == "http://h/q" + (
        "?" + urllib.parse.urlencode(query) if query else ""
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, 10**15), st.booleans(), st.sampled_from(["7", "x", 1.0, 2.5]))))
def test_index_lists_take_positive_integers_only(items: list[object]) -> None:
    valid = bool(items) and all(core.check_index(i) for i in items)
    if valid:
        assert core.index_list(items) == [int(i) for i in items]  # type: ignore[call-overload]
    else:
        with pytest.raises(BadRequestError):
            core.index_list(items)


def test_sdk_retries_5xx_but_never_4xx() -> None:
    """A tiny server answering 503 then 200, or 404: count the attempts."""
    hits: list[str] = []
    plan: list[int] = []

    def serve(sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while True:
                    while b"\r\n\r\n" not in buf:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        buf += chunk
                    if b"\r\n\r\n" not in buf:
                        break
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    hits.append(head.split(b" ")[0].decode())
                    status = plan.pop(0) if plan else 200
                    body = b"7"
                    conn.sendall(
                        f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n"
                        f"X-Eas-Queueservice-Request-Id: r\r\n\r\n".encode()
                        + body
                    )

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    t = threading.Thread(target=serve, args=(sock,), daemon=True)
    t.start()
    try:
        q = QueueClient(f"127.0.0.1:{sock.getsockname()[1]}", "q")
        q.init()
        plan[:] = [503, 503]
        assert q.put(b"x") == ("7", "r") and len(hits) == 3
        hits.clear()
        plan[:] = [404]
        with pytest.raises(Exception) as info:
            q.commit(1)
        assert getattr(info.value, "code", None) == 404 and len(hits) == 1
        q.close()
    finally:
        sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the serving thread
        sock.close()
        t.join(5)
