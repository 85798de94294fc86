"""The queue server's lean HTTP/1.1 front (gateway/lean_http) against the real server.

Plain calls are answered by the fast path; anything unusual must reach aiohttp on the
same connection with every byte intact, and answers must keep the request order.
"""

from __future__ import annotations

import socket

from .server_proc import TOKEN, QueueServer

HEAD = f"Host: x\r\nAuthorization: {TOKEN}\r\n"


def read_responses(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` HTTP/1.1 responses (Content-Length or chunked bodies) from one socket."""
    buf = b""
    out: list[tuple[int, dict[str, str], bytes]] = []
    sock.settimeout(10)
    while len(out) < count:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                while b"\r\n" not in buf:
                    buf += sock.recv(65536)
                size_line, _, buf = buf.partition(b"\r\n")
                size = int(size_line, 16)
                while len(buf) < size + 2:
                    buf += sock.recv(65536)
                body, buf = body + buf[:size], buf[size + 2 :]
                if size == 0:
                    break
        else:
            n = int(headers.get("content-length", "0"))
            while len(buf) < n:
                buf += sock.recv(65536)
            body, buf = buf[:n], buf[n:]
        out.append((status, headers, body))
    return out


def test_pipelined_calls_answer_in_order(queue_server: QueueServer, queue_name: str) -> None:
    path = f"/api/predict/{queue_name}"
    reqs = b""
    for i in range(20):
        body = f"record-{i}".encode()
        reqs += f"POST {path}?k=v{i} HTTP/1.1\r\n{HEAD}Content-Length: {len(body)}\r\n\r\n".encode() + body
    reqs += f"GET {path}?_count_=true HTTP/1.1\r\n{HEAD}\r\n".encode()
    with socket.create_connection(("127.0.0.1", queue_server.port)) as s:
        s.sendall(reqs)  # all at once: several requests arrive in one read
        got = read_responses(s, 21)
    indexes = [int(body) for status, _, body in got[:20]]
    assert all(status == 200 for status, _, _ in got)
    assert indexes == sorted(indexes) and len(set(indexes)) == 20
    assert got[20][2] == b"20"


def test_body_split_across_writes(queue_server: QueueServer, queue_name: str) -> None:
    path = f"/api/predict/{queue_name}"
    body = b"x" * 3000
    head = f"POST {path} HTTP/1.1\r\n{HEAD}Content-Length: {len(body)}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", queue_server.port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in (head[:10], head[10:], body[:1000], body[1000:]):
            s.sendall(piece)
        [(status, headers, idx)] = read_responses(s, 1)
        assert status == 200 and headers["x-eas-queueservice-request-id"]
        s.sendall(f"GET {path}?_index_={int(idx)}&_auto_delete_=false HTTP/1.1\r\n{HEAD}\r\n".encode())
        [(status, headers, data)] = read_responses(s, 1)
    assert status == 200 and body in data


def test_unusual_requests_reach_aiohttp_on_the_same_connection(
    queue_server: QueueServer, queue_name: str
) -> None:
    path = f"/api/predict/{queue_name}"
    chunked = (
        f"POST {path} HTTP/1.1\r\n{HEAD}Transfer-Encoding: chunked\r\n\r\n".encode()
        + b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    plain = f"GET {path}?_count_=true HTTP/1.1\r\n{HEAD}\r\n".encode()
    with socket.create_connection(("127.0.0.1", queue_server.port)) as s:
        s.sendall(plain + chunked + plain)  # fast, then handed over (aiohttp answers the rest)
        got = read_responses(s, 3)
    assert [g[0] for g in got] == [200, 200, 200]
    assert got[0][2] == b"0" and got[2][2] == b"1"
    assert got[1][1].get("server", "").startswith("Python")  # aiohttp's answer
    with socket.create_connection(("127.0.0.1", queue_server.port)) as s:
        s.sendall(f"GET {path}?_count_=true HTTP/1.1\r\n{HEAD}Bad Header: x\r\n\r\n".encode())
        [(status, _, _)] = read_responses(s, 1)
    assert status == 400  # aiohttp's parser refuses the malformed line


def test_connection_close_and_auth(queue_server: QueueServer, queue_name: str) -> None:
    path = f"/api/predict/{queue_name}"
    with socket.create_connection(("127.0.0.1", queue_server.port)) as s:
        s.sendall(f"GET {path}?_count_=true HTTP/1.1\r\nAuthorization: wrong\r\n\r\n".encode())
        assert read_responses(s, 1)[0][0] == 401
        s.sendall(f"GET {path}?_count_=true HTTP/1.1\r\n{HEAD}Connection: close\r\n\r\n".encode())
        [(status, headers, _)] = read_responses(s, 1)
        assert status == 200 and headers["connection"] == "close"
        s.settimeout(5)
        assert s.recv(1) == b""  # the server closed it
