"""One connection's HTTP/1.1 state, without I/O: bytes in, requests (or a verdict) out.

httptools (llhttp, the C parser Node.js uses) checks the syntax; this class decides
which requests are *simple* enough to answer on the fast path:

* ``HTTP/1.1``, method GET/POST/PUT/DELETE, origin-form target under ``/api/predict/`` or
  ``/v2/models/`` (V2 inference)
  without ``%`` or ``#`` in the path, a ``Content-Length`` body (or none) within the size
  limit, no ``Transfer-Encoding``, ``Upgrade`` or ``Expect`` header, no line longer than
  aiohttp accepts, and the owner's ``accept`` says yes;
* anything else, a malformed head included, is handed over: the owner gives the
  connection to aiohttp with :attr:`buf`, which still holds every byte of that request
  and of whatever followed it, so aiohttp sees the connection exactly as the client sent it.

The buffer always starts at the first byte of the request in progress. The parser is fed
each byte once and stops at the end of a request when more bytes follow (pipelining): the
next request is parsed only once the previous one is answered, so answers keep the order
and a request handed over never overtakes one still being answered here.
"""

from __future__ import annotations

from typing import NamedTuple

import httptools

from eas_sdk._core.constants import PREDICT_PATH_PREFIX
from gateway.lean_http.wire import Accept, FastRequest, Headers, Query, parse_query

MAX_HEAD = 64 * 1024
# aiohttp refuses (400) a request line or a header line longer than this: hand such heads over.
_MAX_LINE = 8190
_METHODS = frozenset(("GET", "POST", "PUT", "DELETE"))
# Targets the fast path considers at all (the owner's ``accept`` picks the exact paths).
_PREFIXES = (PREDICT_PATH_PREFIX, "/v2/models/")
# A request with any of these goes to aiohttp (it implements them; we do not).
_HAND_OVER = frozenset(("transfer-encoding", "upgrade", "expect"))

# What next() returns when it has no request: hand the connection over, or what it waits for.
HAND_OVER, IDLE, HEAD, BODY = 0, 1, 2, 3


class Head(NamedTuple):
    """A simple request's head, parsed and accepted (what :func:`parse_head` returns)."""

    method: str
    path: str
    query: str
    headers: Headers
    clen: int
    close: bool
    size: int  # bytes of the head, its blank line included


# A complete request to answer, already removed from the buffer: (the request, its query,
# whether the client asked to close the connection after the answer). A plain tuple: a
# NamedTuple costs a Python call per request.
Ready = tuple[FastRequest, Query, bool]


class _Stop(Exception):
    """Raised from a parser callback to stop llhttp where this class wants it to stop."""


class Connection:
    """What was received on one connection and which request is in progress."""

    __slots__ = (
        "_accept",
        "_clen",
        "_close",
        "_fed",
        "_max_body",
        "_parser",
        "_qs",
        "_size",
        "asked_early",
        "buf",
        "handed_over",
        "head",
        "remote",
    )

    def __init__(self, max_body: int, accept: Accept | None = None, remote: str | None = None) -> None:
        self._max_body = max_body
        self._accept = accept
        self.remote = remote
        self.buf = bytearray()  # from the first byte of the request in progress
        self._fed = 0  # bytes of buf the parser has seen
        self._parser: httptools.HttpRequestParser | None = None
        # The request in progress once its head is in (its body still empty), with the
        # query string, Content-Length, Connection: close and the head's size in bytes.
        self.head: FastRequest | None = None
        self._qs = ""
        self._clen = 0
        self._close = False
        self._size = 0
        self.handed_over = False
        self.asked_early = False  # the owner asked ``early`` about the request in progress

    def receive(self, data: bytes) -> None:
        self.buf += data

    def next(self) -> Ready | int:
        """The next complete request (consumed from the buffer), or HAND_OVER, or what the
        connection waits for: IDLE (nothing buffered), HEAD or BODY."""
        head = self.head
        if head is None or len(self.buf) < self._size + self._clen:
            # Parse what is new; not once the body is in (the bytes after it wait their turn).
            if not self.handed_over and self._fed < len(self.buf):
                self._feed()
            head = self.head
        if self.handed_over:
            return HAND_OVER
        if head is not None and len(self.buf) >= self._size + self._clen:
            return self._take()
        if not self.buf:
            return IDLE
        if head is None:
            if len(self.buf) > MAX_HEAD:
                self.handed_over = True  # aiohttp answers an oversized head
                return HAND_OVER
            return HEAD
        return BODY

    def pending(self) -> tuple[FastRequest, int] | None:
        """The request whose head is in and whose body is still arriving (its ``body`` is
        empty), and how many body bytes are missing; None when there is no such request."""
        head = self.head
        missing = self._size + self._clen - len(self.buf)
        if head is None or missing <= 0:
            return None
        return FastRequest(head.method, head.path, head.headers, self._clen, b"", self.remote), missing

    # ------------------------------------------------------------------ parsing
    def _feed(self) -> None:
        buf = self.buf
        start = self._fed
        if start == 0 and not buf[:1].isalpha():
            # llhttp skips blank lines before a request line; the head arithmetic below
            # counts from the buffer's start, so such rarities go to aiohttp.
            self.handed_over = True
            return
        self._fed = len(buf)
        if self._parser is None:
            self._parser = httptools.HttpRequestParser(self)
        try:
            if start == 0:
                self._parser.feed_data(buf)
            else:
                # A view, not a copy; released before the buffer can change size again.
                with memoryview(buf) as whole, whole[start:] as piece:
                    self._parser.feed_data(piece)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if not isinstance(cause, _Stop):
                raise (cause or exc) from None  # a bug in a hook (accept): not the client's fault
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self.handed_over = True  # malformed (aiohttp answers 400) or a protocol switch

    def _take(self) -> Ready:
        req = self.head
        assert req is not None
        size = self._size
        end = size + self._clen
        if end > size:
            req.body = bytes(self.buf[size:end])
        del self.buf[:end]
        if self._fed != end:
            # The parser read into the next request, or was stopped by an exception: a
            # fresh one reads on from ``end``.
            self._parser = None
        self._fed = 0
        self.head = None
        self.asked_early = False
        return req, parse_query(self._qs), self._close

    # llhttp's callbacks (httptools calls only the ones defined)
    def on_headers_complete(self) -> None:
        if self.head is not None:
            raise _Stop  # the next request's head: it waits until this one is answered
        head = self._simple_head()
        if head is None:
            self.handed_over = True
            raise _Stop
        self.head = head
        # No on_message_complete (one Python call less per request): the body is complete
        # once the buffer holds Content-Length bytes after the head.

    def _simple_head(self) -> FastRequest | None:
        """The head just parsed, when it is a simple request the owner accepts."""
        parser = self._parser
        assert parser is not None
        size = self.buf.find(b"\r\n\r\n") + 4
        if size < 4 or size > self._fed:
            return None  # not where llhttp ended the head: let aiohttp judge it
        # llhttp has checked the syntax (token names, no obs-fold, CRLF line ends), so plain
        # splits read the head; one decode and C-level splits cost less than a Python
        # callback per header.
        first, *lines = self.buf[: size - 4].decode("latin-1").split("\r\n")
        request_line = first.split(" ")
        if len(request_line) != 3:
            return None
        method, target, version = request_line
        if version != "HTTP/1.1" or method not in _METHODS or not target.startswith(_PREFIXES):
            return None
        path, _, qs = target.partition("?")
        if "%" in path or "#" in target or path in _PREFIXES:
            return None
        # Filled from the last line to the first, so the first value of a repeated name wins
        # (like aiohttp's get); one plain loop, with no list of pairs built in between.
        headers = Headers()
        for line in reversed(lines):
            name, _, value = line.partition(":")
            headers[name.lower()] = value.strip(" \t")
        if not _HAND_OVER.isdisjoint(headers):
            return None
        clen = 0
        raw = dict.get(headers, "content-length")
        if raw is not None:
            if not raw.isdigit() or not raw.isascii():
                return None
            clen = int(raw)
            if clen > self._max_body:
                return None  # aiohttp answers 413 for it
        if size > _MAX_LINE and any(len(line) > _MAX_LINE for line in [first, *lines]):
            return None
        if self._accept is not None and not self._accept(method, path, headers, clen):
            return None
        self._qs = qs
        self._clen = clen
        self._close = not parser.should_keep_alive()
        self._size = size
        content_length = clen if raw is not None else None
        return FastRequest(method, path, headers, content_length, b"", self.remote)


def parse_head(head: bytes, max_body: int) -> Head | None:
    """The simple request in ``head`` (a complete head, its blank line included), or None
    when it would be handed over; for tests and tools."""
    conn = Connection(max_body)
    conn.receive(head)
    conn._feed()
    req = conn.head
    if conn.handed_over or req is None:
        return None
    return Head(req.method, req.path, conn._qs, req.headers, conn._clen, conn._close, conn._size)
