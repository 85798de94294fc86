"""HTTP/1.1 client framing without I/O, shared by the sync and the asyncio transport.

The SDK's calls are small request/response pairs on keep-alive connections, and
most of their client-side cost is the HTTP library, not the network: writing the
request as one buffer (one ``sendall``, one segment) and reading the answer with
bytes operations costs a fraction of ``http.client`` (whose header parsing goes
through the ``email`` package). The two transports feed received bytes into
:class:`ResponseParser` and send what :func:`encode_request` returns, the same way
``websockets`` keeps its protocol apart from its sync and asyncio drivers.

Only what a client of EAS needs: Content-Length, chunked and close-delimited
bodies, ``Connection: close`` and HTTP/1.0, responses without a body (HEAD, 1xx,
204, 304). No request streaming, no pipelining, no upgrades.
"""

from __future__ import annotations

from collections.abc import Mapping

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


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _UNTIL_CLOSE, _DONE = range(7)


class ResponseParser:
    """Incremental parser of one response: ``feed(data)`` until it returns True.

    After that ``status``, ``headers`` (a dict, names as sent), ``body`` and
    ``will_close`` are set, and ``leftover`` holds bytes that followed the response.
    ``started`` turns True with the first byte fed (the response has begun: it is
    never retried). ``feed_eof()`` ends a close-delimited body (a response cut off
    anywhere else raises :class:`ProtocolError`).
    """

    __slots__ = (
        "_buf",
        "_chunks",
        "_left",
        "_state",
        "body",
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
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.will_close = False
        self.leftover = b""
        self._buf = bytearray()
        self._chunks: list[bytes] = []
        self._left = 0
        self._state = _HEAD

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes) -> bool:
        if data:
            self.started = True
            self._buf += data
        return self._advance()

    def feed_eof(self) -> bool:
        """The server closed the connection: the end of a close-delimited body, else an error."""
        if self._state == _UNTIL_CLOSE:
            self._chunks.append(bytes(self._buf))
            self._buf.clear()
            self._finish()
            return True
        if self._state == _DONE:
            return True
        if not self.started:
            raise ConnectionResetError("connection closed by the server before any response byte")
        raise ProtocolError("connection closed in the middle of the response")

    def _finish(self) -> None:
        self.body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks = []
        self.leftover = bytes(self._buf)
        self._buf.clear()
        self._state = _DONE

    def _advance(self) -> bool:
        buf = self._buf
        while True:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD:
                        raise ProtocolError("response head too large")
                    return False
                self._parse_head(bytes(buf[:end]))
                del buf[: end + 4]
            elif state == _LENGTH:
                if len(buf) < self._left:
                    return False
                if len(buf) == self._left:
                    self._chunks.append(bytes(buf))
                    buf.clear()
                else:
                    with memoryview(buf) as view:
                        self._chunks.append(bytes(view[: self._left]))
                    del buf[: self._left]
                self._finish()
            elif state == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    return False
                try:
                    size = int(bytes(buf[:end]).split(b";")[0], 16)
                except ValueError:
                    raise ProtocolError("bad chunk size") from None
                del buf[: end + 2]
                self._left = size
                self._state = _CHUNK_DATA if size else _TRAILER
            elif state == _CHUNK_DATA:
                if len(buf) < self._left + 2:
                    return False
                self._chunks.append(bytes(buf[: self._left]))
                del buf[: self._left + 2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILER:  # trailer lines, then the final empty line
                end = buf.find(b"\r\n")
                if end < 0:
                    return False
                del buf[: end + 2]
                if end == 0:
                    self._finish()
            elif state == _UNTIL_CLOSE:
                return False
            else:
                return True

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1.") or len(rest) < 3 or not rest[:3].isdigit():
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        status = self.status = int(rest[:3])
        headers = self.headers
        length = chunked = None
        connection = ""
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError("bad header line")
            name, value = name.strip(), value.strip()
            headers[name] = value
            lower = name.lower()
            if lower == "content-length":
                length = value
            elif lower == "transfer-encoding":
                chunked = "chunked" in value.lower()
            elif lower == "connection":
                connection = value.lower()
        self.will_close = connection == "close" or version == "HTTP/1.0"
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            if status == 101:
                raise ProtocolError("unexpected protocol switch")
            self.headers = {}
            return
        if self.method == "HEAD" or status in (204, 304):
            self._state = _DONE
            self._finish()
        elif chunked:
            self._state = _CHUNK_SIZE
        elif length is not None:
            try:
                self._left = int(length)
            except ValueError:
                raise ProtocolError("bad Content-Length") from None
            if self._left < 0:
                raise ProtocolError("bad Content-Length")
            self._state = _LENGTH
        else:  # delimited by the end of the connection
            self.will_close = True
            self._state = _UNTIL_CLOSE
