"""Bad input gets a 4xx naming the parameter, changes nothing, and the server stays up.

Every test runs against the queue-only server and through the full gateway (``python -m
gateway serve``: its lean front and the predict route's queue checks in front of the same
handlers)."""

from __future__ import annotations

import http.client
import urllib.parse
from collections.abc import Callable

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from eas_sdk.queue import QueueClient

from .server_proc import TOKEN, GatewayServer, QueueServer

Server = QueueServer | GatewayServer

AUTH = {"Authorization": TOKEN}
WS_HEADERS = {
    **AUTH,
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


def call(
    server: Server,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=AUTH if headers is None else headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


BAD_GETS = [
    ("_index_=abc", "_index_"),
    ("_index_=-1", "_index_"),
    ("_index_=1.5", "_index_"),
    ("_index_=", "_index_"),
    ("_index_=%201", "_index_"),
    ("_index_=1e3", "_index_"),
    ("_index_=0x10", "_index_"),
    ("_index_=18446744073709551616", "_index_"),
    ("_length_=0", "_length_"),
    ("_length_=100000000", "_length_"),
    ("_timeout_=5x", "_timeout_"),
    ("_timeout_=-1s", "_timeout_"),
    ("_auto_delete_=maybe", "_auto_delete_"),
    ("_raw_=true", "_raw_"),
    ("_index_=1&_index_=2", "_index_"),
    ("_bogus_=1", "_bogus_"),
    ("_search_=true&_index_=0", "_index_"),
    ("_search_=true&_index_=x", "_index_"),
    ("_watch_=true&_window_=5", "_watch_"),
]


@pytest.mark.parametrize(("query", "param"), BAD_GETS)
def test_bad_get_names_parameter(any_server: Server, queue_name: str, query: str, param: str) -> None:
    status, text = call(any_server, "GET", f"/api/predict/{queue_name}?{query}")
    assert status == 400 and param in text, (status, text)


BAD_INDEXES = ["", "1,,2", "1,abc", "-3", "0", "1.0", ",".join(["1"] * 10001)]


@pytest.mark.parametrize("indexes", BAD_INDEXES)
@pytest.mark.parametrize("method", ["PUT", "DELETE"])
def test_bad_indexes(any_server: Server, queue_name: str, method: str, indexes: str) -> None:
    q = urllib.parse.urlencode({"_indexes_": indexes})
    status, text = call(
        any_server, method, f"/api/predict/{queue_name}?{q}", b"" if method == "PUT" else None
    )
    if isinstance(any_server, GatewayServer) and len(q) > 8190:
        # The gateway's HTTP parser refuses a request line over 8 KiB before the queue sees
        # it (gateway/fronts/server.py: "malformed HTTP request"), so the 400 cannot name the key.
        assert status == 400, (status, text[:200])
        return
    assert status == 400 and "_indexes_" in text, (status, text[:200])


def test_other_refusals(any_server: Server, any_client: Callable[..., QueueClient], queue_name: str) -> None:
    path = f"/api/predict/{queue_name}"
    assert call(any_server, "POST", f"{path}?_tag=1", b"x")[0] == 400
    status, text = call(any_server, "POST", f"{path}?_priority_=1", b"x")
    assert status == 400 and "_priority_" in text
    status, text = call(any_server, "DELETE", f"{path}?_trunc_=true&_index_=abc")
    assert status == 400 and "_index_" in text
    assert call(any_server, "PUT", f"{path}?_indexes_=1&x=2", b"")[0] == 400
    assert call(any_server, "GET", "/api/predict/nope?_attrs_=true")[0] == 404
    assert call(any_server, "GET", f"{path}?_attrs_=true", headers={})[0] == 401
    assert call(any_server, "GET", f"{path}?_attrs_=true", headers={"Authorization": "wrong"})[0] == 401
    # commit of an index never delivered to the group: 404, and nothing changes
    q = any_client()
    index, _ = q.put(b"x")
    status, text = call(any_server, "PUT", f"{path}?_indexes_={index}", b"")
    assert status == 404 and index in text
    assert q.attributes()["stream.length"] == "1"


def test_full_and_oversize(any_server: Server) -> None:
    path = "/api/predict/small"
    call(any_server, "DELETE", f"{path}?_trunc_=true&_index_=1000000")
    assert call(any_server, "POST", path, b"x" * 17)[0] == 413
    for _ in range(3):
        assert call(any_server, "POST", path, b"ok")[0] == 200
    status, _ = call(any_server, "POST", path, b"ok")
    assert status == 429  # refused, nothing evicted
    status, text = call(any_server, "GET", f"{path}?_attrs_=true")
    assert '"stream.length": "3"' in text
    call(any_server, "DELETE", f"{path}?_trunc_=true&_index_=1000000")


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("_window_=-1", "_window_"),
        ("_window_=abc", "_window_"),
        ("_window_=0", "_window_"),
        ("_window_=1000000000", "_window_"),
        ("_window_=2000", "_window_"),
        ("_window_=5&_index_=x", "_index_"),
        ("_window_=5&_auto_commit_=perhaps", "_auto_commit_"),
        ("_window_=5&_x=1", "_x"),
    ],
)
def test_bad_watch_is_refused_before_upgrade(
    any_server: Server, queue_name: str, query: str, param: str
) -> None:
    status, text = call(
        any_server, "GET", f"/api/predict/{queue_name}?_watch_=true&{query}", headers=WS_HEADERS
    )
    assert status == 400 and param in text, (status, text)


def test_ws_refusals(any_server: Server, queue_name: str) -> None:
    url = f"ws://127.0.0.1:{any_server.port}/api/predict/{queue_name}?_watch_=true&_window_=2&_index_=0"
    with pytest.raises(InvalidStatus) as info:
        connect(url, additional_headers={"Authorization": "wrong"}, proxy=None, legacy=True)
    assert info.value.response.status_code == 401
    # A text frame (clients send none) closes the watch with 1003.
    ws = connect(url, additional_headers=AUTH, proxy=None, compression=None, legacy=True)
    ws.send("hello")
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1003
    ws.close()
    # A frame over the server's limit closes with 1009.
    ws = connect(url, additional_headers=AUTH, proxy=None, compression=None, legacy=True)
    ws.send(b"x" * (128 * 1024))
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    ws.close()


def test_server_still_serves_after_bad_input(any_client: Callable[..., QueueClient]) -> None:
    q = any_client()
    index, rid = q.put(b"fine")
    assert q.get(request_id=rid)[0].index == int(index)


@pytest.mark.parametrize(("frame", "code"), [("hello", 1003), (b"x" * (128 * 1024), 1009)])
def test_ws_refusal_gives_the_watchers_records_back(
    any_server: Server,
    any_client: Callable[..., QueueClient],
    queue_name: str,
    frame: str | bytes,
    code: int,
) -> None:
    """A watch closed for a bad frame (1003, 1009) is a consumer leaving: the records it held
    uncommitted go to the next consumer of its group, once."""
    from eas_sdk._proto.queue_pb2 import DataFrameProto

    q = any_client()
    indexes = [int(q.put(f"r{i}")[0]) for i in range(3)]
    url = f"ws://127.0.0.1:{any_server.port}/api/predict/{queue_name}?_watch_=true&_window_=2&_index_=0"
    headers = {**AUTH, "X-EAS-QueueService-Redis-Uid": "rude"}
    ws = connect(url, additional_headers=headers, proxy=None, compression=None, legacy=True)
    held = []
    for _ in range(2):
        df = DataFrameProto()
        df.ParseFromString(ws.recv(timeout=5))
        held.append(df.index)
    assert held == indexes[:2]
    ws.send(frame)
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == code
    ws.close()
    other = any_client(uid="polite")
    got: list[int] = []
    with other.watch(0, 3) as watcher:
        frames = watcher.run()
        for df in frames:
            got.append(df.index)
            other.commit(df.index)
            if len(got) == 3:
                break
        frames.close()
    assert sorted(got) == indexes and len(got) == len(set(got))
    assert q.attributes()["stream.length"] == "0"
