"""HTTP/1.1 client framing without I/O, shared by the sync and the asyncio transport.

The SDK's calls are small request/response pairs on keep-alive connections, and
most of their client-side cost is the HTTP library, not the network: writing the
request as one buffer (one ``sendall``, one segment) and parsing the answer with
httptools (llhttp, the C parser uvicorn and the gateway use) costs a fraction of
``http.client`` (whose header parsing goes through the ``email`` package). The two
transports feed received bytes into :class:`ResponseParser` and send what
:func:`encode_request` returns, the same way ``websockets`` keeps its protocol
apart from its sync and asyncio drivers.

Only what a client of EAS needs: Content-Length, chunked and close-delimited
bodies, ``Connection: close`` and HTTP/1.0, responses without a body (HEAD, 1xx,
204, 304). No request streaming, no pipelining, no upgrades.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

import httptools

from .._core.failures import ProtocolError

__all__ = ["MAX_HEAD", "ProtocolError", "ResponseParser", "encode_head", "encode_headers", "encode_request"]

MAX_HEAD = 65536  # a response head larger than this is refused as malformed


def encode_headers(headers: Mapping[str, str]) -> bytes:
    """``Name: value\\r\\n`` lines (latin-1, as HTTP/1.1 header bytes are).

    A name or value holding a CR or LF is refused (ValueError): it would smuggle
    extra header lines, or a second request, into the connection.
    """
    text = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
    lines = len(headers)
    if text.count("\n") != lines or text.count("\r") != lines:
        raise ValueError("a header name or value contains CR or LF")
    return text.encode("latin-1")


def encode_head(
    method: str, target: str, host: bytes, headers: Mapping[str, str], length: int | None, head: bytes = b""
) -> bytes:
    """The request line and headers, ending with the empty line.

    ``head`` holds header lines already encoded (a caller's fixed headers, encoded
    once); ``headers`` the rest. ``length``: the body's size (Content-Length), also
    sent as 0 for a POST or PUT without a body; None and no body for other methods.
    """
    if " " in target or "\r" in target or "\n" in target:
        raise ValueError("the request target contains whitespace")
    parts = [f"{method} {target} HTTP/1.1\r\nHost: ".encode("latin-1"), host, b"\r\n", head]
    if headers:
        parts.append(encode_headers(headers))
    if length or method in ("POST", "PUT"):
        parts.append(b"Content-Length: %d\r\n" % (length or 0))
    parts.append(b"\r\n")
    return b"".join(parts)


def encode_request(
    method: str, target: str, host: bytes, headers: Mapping[str, str], body: bytes | None, head: bytes = b""
) -> bytes:
    """The whole request as one buffer (see :func:`encode_head`)."""
    out = encode_head(method, target, host, headers, len(body) if body else None, head)
    return out + body if body else out


class ResponseParser:
    """Incremental parser of one response over httptools: ``feed(data)`` until it returns True.

    After that ``status``, ``headers`` (a dict, names as sent), ``body`` and
    ``will_close`` are set, and ``leftover`` holds bytes that followed the response.
    ``started`` turns True with the first byte fed (the response has begun: it is
    never retried). ``feed_eof()`` ends a close-delimited body (a response cut off
    anywhere else raises :class:`ProtocolError`).

    httptools (llhttp) frames the message; what it cannot know is left here: the
    request method (the answer to a HEAD ends with its head), where the response
    ended inside a buffer that holds more, and the end of the connection (it has no
    ``finish``), which completes a body delimited by the close.
    """

    __slots__ = (
        "_chunks",
        "_error",
        "_extra",
        "_fed",
        "_head_done",
        "_parser",
        "_received",
        "_seen",
        "body",
        "done",
        "headers",
        "leftover",
        "method",
        "started",
        "status",
        "will_close",
    )

    def __init__(self, method: str = "GET") -> None:
        self.method = method
        self.started = False
        self.done = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.will_close = False
        self.leftover = b""
        self._chunks: list[bytes] = []
        # What was fed, to find where the response ended if more followed it (see
        # _locate_leftover); None once a length-delimited body is under way, whose end is
        # then found by counting: _received body bytes came before the current buffer.
        self._seen: list[bytes] | None = []
        self._received = 0
        self._fed = 0
        self._head_done = False
        self._extra = False
        self._error: Exception | None = None
        # The parser calls back into this object (a reference cycle): _close() breaks it.
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)

    def feed(self, data: bytes) -> bool:
        if self.done:
            return True
        if not data:
            return False
        self.started = True
        parser = self._parser
        if parser is None:
            raise ProtocolError("the response already failed")
        seen = self._seen
        if seen is not None:
            seen.append(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ProtocolError("unexpected protocol switch"))
        except httptools.HttpParserError as exc:
            if self._error is not None:
                self._fail(self._error)
            if not self.done:  # bytes after a complete response are not the response's fault
                self._fail(ProtocolError(f"malformed response: {exc}"))
            self._extra = True
        if self.done:
            if self._extra:
                self.leftover = self._locate_leftover(data)
            self._close()
            return True
        if not self._head_done:
            self._fed += len(data)
            if self._fed > MAX_HEAD:
                self._fail(ProtocolError("response head too large"))
        elif seen is not None and self._length_delimited():
            self._seen = None  # a large body is not kept twice
            self._received = sum(map(len, self._chunks))
        elif seen is None:  # the whole buffer was body
            self._received += len(data)
        return False

    def feed_eof(self) -> bool:
        """The server closed the connection: the end of a close-delimited body, else an error."""
        if self.done:
            return True
        if not self.started:
            raise ConnectionResetError("connection closed by the server before any response byte")
        if self._head_done and self._parser is not None and self._until_close():
            self._complete()
            self._close()
            return True
        self._fail(ProtocolError("connection closed in the middle of the response"))

    def _until_close(self) -> bool:
        """The body is delimited by the end of the connection (no length, not chunked)."""
        names = {name.lower() for name in self.headers}
        return "content-length" not in names and "transfer-encoding" not in names

    def _length_delimited(self) -> bool:
        """The body's size is Content-Length (not chunked, not until the close)."""
        names = {name.lower() for name in self.headers}
        return "content-length" in names and "transfer-encoding" not in names

    def _fail(self, exc: Exception) -> NoReturn:
        self._close()
        raise exc

    def _close(self) -> None:
        self._parser = None
        self._seen = None

    def _complete(self) -> None:
        chunks = self._chunks
        self.body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self.done = True

    def _locate_leftover(self, last: bytes) -> bytes:
        """The bytes of ``last`` (the buffer just fed) after the end of the response.

        Only when a buffer held more than the response (the server sent something
        unasked for, so the connection is dropped anyway): httptools does not say
        where inside a buffer a message ended. A length-delimited body begun in an
        earlier buffer ends where its length does; otherwise the response is parsed
        again, ``last`` a byte at a time.
        """
        seen = self._seen
        if seen is None:
            return last[len(self.body) - self._received :]
        again = ResponseParser(self.method)
        for data in seen[:-1]:
            again.feed(data)
        for i in range(len(last)):
            if again.feed(last[i : i + 1]):
                return last[i + 1 :]
        return b""  # not reached: the response did complete inside this buffer

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._head_done:  # trailers of a chunked body are not kept
            self.headers[name.decode("latin-1")] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        if self.done:
            self._extra = True
            return
        parser = self._parser
        assert parser is not None  # callbacks only run inside feed()
        status = self.status = parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            if status == 101:
                self._error = ProtocolError("unexpected protocol switch")
                raise self._error
            self.headers = {}
            return
        self._head_done = True
        self.will_close = not parser.should_keep_alive() or parser.get_http_version() == "1.0"
        if self.method == "HEAD":  # httptools expects the body Content-Length announces
            self._complete()

    def on_body(self, body: bytes) -> None:
        if self.done:  # bytes that followed the answer to a HEAD
            self._extra = True
        else:
            self._chunks.append(body)

    def on_message_begin(self) -> None:
        if self.done:  # a second response in the same buffer
            self._extra = True

    def on_message_complete(self) -> None:
        if not self._head_done or self.done:  # the end of an interim answer, or after a HEAD
            return
        self._complete()
