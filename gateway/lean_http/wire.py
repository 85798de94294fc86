"""What the lean front hands to its handlers and writes back: requests, replies, headers."""

from __future__ import annotations

import email.utils
import http
import time
import urllib.parse
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NamedTuple

_REASONS = {s.value: s.phrase for s in http.HTTPStatus}


class Reply(NamedTuple):
    """An answer, independent of the server that writes it (aiohttp or the fast path)."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] | None = None


Query = list[tuple[str, str]]
Serve = Callable[["FastRequest", Query], Coroutine[Any, Any, Reply]]
# (method, path, headers, content length) of a simple request -> answer it here (else aiohttp does)
Accept = Callable[[str, str, "Headers", int], bool]
# An accepted request whose head is in, its body not (``body`` is empty) -> an answer that
# cannot wait for the body (early), or the answer to a body that missed body_timeout (late).
Early = Callable[["FastRequest"], "Reply | None"]
Late = Callable[["FastRequest"], Reply]
# Admit a body still arriving: -> a callable that gives back what it holds once the body is
# in (or the connection ends), or None to hand the connection over to aiohttp instead.
Admit = Callable[["FastRequest"], "Callable[[], None] | None"]


class Headers(dict[str, str]):
    """Request headers keyed by lower-case name (case-insensitive reads, first value wins)."""

    __slots__ = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict.get(self, key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return dict.__getitem__(self, key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and dict.__contains__(self, key.lower())


class FastRequest:
    """The parts of a request that the handlers read (see ``queue.http.RequestLike``)."""

    __slots__ = ("body", "content_length", "headers", "method", "path", "remote")

    def __init__(
        self,
        method: str,
        path: str,
        headers: Headers,
        content_length: int | None,
        body: bytes,
        remote: str | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.content_length = content_length
        self.body = body
        self.remote = remote

    async def read(self) -> bytes:
        return self.body


def parse_query(qs: str) -> Query:
    """Like yarl's ``URL.query`` (which aiohttp uses): ``&``-separated, ``+`` is a space."""
    if not qs:
        return []
    if "%" in qs or "+" in qs:
        # A list of indexes comes with its commas escaped: that alone needs no unquoting pass.
        plain = qs.replace("%2C", ",")
        if "%" in plain or "+" in plain:
            return urllib.parse.parse_qsl(qs, keep_blank_values=True)
        qs = plain
    out: Query = []
    for part in qs.split("&"):
        if part:
            k, _, v = part.partition("=")
            out.append((k, v))
    return out


_date_second = 0
_date_line = ""


def _date() -> str:
    """The ``Date`` header line (RFC 9110 asks servers with a clock to send one), built once a second."""
    global _date_second, _date_line
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        _date_line = f"Date: {email.utils.formatdate(now, usegmt=True)}\r\n"
    return _date_line


# (status, content type) -> the answer's first lines: most answers share a handful.
_HEADS: dict[tuple[int, str], str] = {}


def encode_reply(reply: Reply, close: bool) -> bytes:
    """The whole answer as one buffer (written with one ``write``)."""
    key = (reply.status, reply.content_type)
    first = _HEADS.get(key)
    if first is None:
        if len(_HEADS) >= 256:
            _HEADS.clear()
        status = reply.status
        first = _HEADS[key] = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nContent-Type: {reply.content_type}\r\n"
        )
    parts = [f"{first}Content-Length: {len(reply.body)}\r\n{_date()}"]
    if reply.headers:
        for k, v in reply.headers.items():
            parts.append(f"{k}: {v}\r\n")
    if close:
        parts.append("Connection: close\r\n")
    parts.append("\r\n")
    return "".join(parts).encode("latin-1") + reply.body
