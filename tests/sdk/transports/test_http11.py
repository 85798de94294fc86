"""The HTTP/1.1 framing of the SDK transports: request bytes and incremental response parsing."""

from __future__ import annotations

import pytest

from eas_sdk._transports.http11 import ProtocolError, ResponseParser, encode_head, encode_request


def _parse(raw: bytes, method: str = "POST", step: int = 0) -> ResponseParser:
    p = ResponseParser(method)
    if step:
        for i in range(0, len(raw), step):
            p.feed(raw[i : i + step])
    else:
        p.feed(raw)
    return p


def test_request_is_one_buffer_with_host_headers_and_length() -> None:
    raw = encode_request("POST", "/p?q=1", b"h:81", {"A": "1", "B": "x y"}, b"body")
    assert raw == b"POST /p?q=1 HTTP/1.1\r\nHost: h:81\r\nA: 1\r\nB: x y\r\nContent-Length: 4\r\n\r\nbody"
    assert encode_request("GET", "/", b"h", {}, None) == b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"
    assert b"Content-Length: 0\r\n" in encode_request("PUT", "/", b"h", {}, b"")
    assert encode_head("POST", "/", b"h", {}, 9, b"Fixed: 1\r\n").endswith(
        b"Fixed: 1\r\nContent-Length: 9\r\n\r\n"
    )


@pytest.mark.parametrize("step", [0, 1, 7])
def test_content_length_body_in_any_pieces(step: int) -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello"
    p = _parse(raw, step=step)
    assert p.done and (p.status, p.body, p.headers["X-A"], p.will_close) == (200, b"hello", "b", False)


@pytest.mark.parametrize("step", [0, 1, 5])
def test_chunked_body_with_trailers(step: int) -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n1\r\n!\r\n0\r\nT: 1\r\n\r\n"
    )
    p = _parse(raw, step=step)
    assert p.done and p.body == b"hello!" and p.leftover == b""


def test_close_delimited_body_ends_at_eof() -> None:
    p = _parse(b"HTTP/1.0 200 OK\r\n\r\nabc")
    assert not p.done and p.will_close
    assert p.feed_eof() and p.body == b"abc"


def test_bodiless_answers_and_interim_100() -> None:
    assert _parse(b"HTTP/1.1 204 No Content\r\n\r\n").done
    head = _parse(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", method="HEAD")
    assert head.done and head.body == b""
    p = _parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nk")
    assert (p.status, p.body) == (200, b"k")


def test_connection_close_and_bytes_after_the_response() -> None:
    p = _parse(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    assert p.done and p.will_close
    extra = _parse(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxJUNK")
    assert extra.body == b"x" and extra.leftover == b"JUNK"


@pytest.mark.parametrize("step", [0, 1, 7])
def test_where_a_response_ends_inside_a_buffer(step: int) -> None:
    # httptools does not say where a message ended inside a buffer: the parser finds it.
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"
    p = _parse(raw, step=step)  # bytes fed once the response is complete are not read
    after = raw[raw.index(b"okHTTP") + 2 :]
    assert p.body == b"ok" and after.startswith(p.leftover) and (p.leftover != b"") == (step != 1)
    chunked = _parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nT: 1\r\n\r\nZZ")
    assert (chunked.body, chunked.leftover, "T" in chunked.headers) == (b"x", b"ZZ", False)


def test_where_a_body_begun_in_an_earlier_buffer_ends() -> None:
    p = ResponseParser()
    assert not p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nab")
    assert not p.feed(b"cd")
    assert p.feed(b"efJUNK") and (p.body, p.leftover) == (b"abcdef", b"JUNK")
    chunked = ResponseParser()
    assert not chunked.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n")
    assert chunked.feed(b"0\r\n\r\nJUNK") and (chunked.body, chunked.leftover) == (b"ab", b"JUNK")


def test_head_answer_ends_with_its_head() -> None:
    # httptools does not know the method: it would read the announced 9 bytes as the body.
    p = _parse(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nJUNK", method="HEAD")
    assert p.done and (p.body, p.leftover, p.headers["Content-Length"]) == (b"", b"JUNK", "9")
    assert _parse(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n").done


def test_keep_alive_header_on_http_1_0_still_closes() -> None:
    p = _parse(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx")
    assert p.done and p.will_close


def test_a_failed_parser_refuses_more_bytes() -> None:
    p = ResponseParser()
    with pytest.raises(ProtocolError):
        p.feed(b"HTTP/1.1 2xx OK\r\n\r\n")
    with pytest.raises(ProtocolError):
        p.feed(b"HTTP/1.1 200 OK\r\n")


def test_started_flag_and_where_an_eof_lands() -> None:
    p = ResponseParser()
    assert not p.started
    with pytest.raises(ConnectionResetError):  # nothing arrived: a dropped connection
        p.feed_eof()
    p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    assert p.started and not p.done
    with pytest.raises(ProtocolError):  # cut off in the middle of the body
        p.feed_eof()


@pytest.mark.parametrize(
    "raw",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 2xx OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",  # smuggling
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"HTTP/2 200 OK\r\n\r\n",
    ],
)
def test_malformed_responses(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        _parse(raw)


def test_oversized_head_is_refused() -> None:
    with pytest.raises(ProtocolError):
        _parse(b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * 70000)


@pytest.mark.parametrize(
    ("target", "headers"),
    [("/p", {"X": "a\r\nInjected: 1"}), ("/p", {"X\n": "a"}), ("/p q", {}), ("/p\r\nX: 1", {})],
)
def test_header_and_target_injection_is_refused(target: str, headers: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        encode_request("GET", target, b"h", headers, None)
