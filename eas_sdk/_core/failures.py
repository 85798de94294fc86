"""The one place where a transport exception becomes a :class:`FailureKind`.

Every client (predict and queue, sync and async) and every transport go through
:func:`classify`, so the same failure is retried, or not, the same way everywhere:

* ``CONNECT`` (retryable, nothing was sent): refused, unreachable, name not resolved;
* ``DISCONNECTED`` (retryable before any response byte; a free re-send when it hit a
  reused keep-alive connection, which the server most likely closed while idle):
  reset, broken pipe, closed without an answer;
* ``TIMEOUT``: the attempt's time ran out (pool wait, connect, send or read);
* ``FATAL``: never retried: TLS verification or another TLS set-up failure, a bad URL;
* ``BROKEN``: the response was malformed; a response that had started is final anyway.

I/O-free: only exception types are inspected. aiohttp and urllib3 exceptions are
recognised when those libraries are loaded (callers of the SDK still hand them in).
"""

from __future__ import annotations

import asyncio
import builtins
import http.client
import socket
import ssl
import sys

from .retry import FailureKind

__all__ = ["FailureKind", "ProtocolError", "classify", "describe"]


class ProtocolError(Exception):
    """The server's bytes are not a valid HTTP/1.1 response (raised by the SDK transports)."""


def describe(exc: BaseException) -> str:
    """``Type: message`` (or just the type), for error messages and logs."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def classify(exc: BaseException, *, connecting: bool = False) -> FailureKind:
    """The kind of a failed attempt. ``connecting``: it happened while opening the connection."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return FailureKind.FATAL
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return FailureKind.CONNECT if connecting else FailureKind.DISCONNECTED  # a close, not a TLS error
    if isinstance(exc, ssl.SSLError):
        return FailureKind.FATAL
    library = _library_kind(exc)
    if library is not None:
        return library
    if isinstance(exc, (builtins.TimeoutError, asyncio.TimeoutError)):
        return FailureKind.TIMEOUT
    if isinstance(exc, (ValueError, UnicodeError)):
        return FailureKind.FATAL  # a URL or header that cannot be sent
    if isinstance(exc, http.client.HTTPException) and not isinstance(exc, ConnectionError):
        return FailureKind.BROKEN
    if isinstance(exc, (ConnectionRefusedError, socket.gaierror)) or connecting:
        return FailureKind.CONNECT if isinstance(exc, OSError) else FailureKind.FATAL
    if isinstance(exc, OSError):
        return FailureKind.DISCONNECTED
    if isinstance(exc, ProtocolError):
        return FailureKind.BROKEN
    return FailureKind.FATAL


def _library_kind(exc: BaseException) -> FailureKind | None:
    """aiohttp's and urllib3's exceptions, when the library is loaded at all."""
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(exc, aiohttp.ClientError):
        if isinstance(exc, aiohttp.ServerTimeoutError):
            return FailureKind.TIMEOUT
        if isinstance(exc, (aiohttp.ClientConnectorCertificateError, aiohttp.InvalidURL)):
            return FailureKind.FATAL
        if isinstance(exc, aiohttp.ClientConnectorError):
            return FailureKind.CONNECT
        if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
            return FailureKind.DISCONNECTED
        return FailureKind.BROKEN
    u3 = sys.modules.get("urllib3.exceptions")
    if u3 is not None and isinstance(exc, u3.HTTPError):
        if isinstance(exc, u3.NewConnectionError):  # subclasses ConnectTimeoutError in urllib3 2
            return FailureKind.CONNECT
        if isinstance(exc, (u3.TimeoutError, u3.EmptyPoolError)):
            return FailureKind.TIMEOUT
        if isinstance(exc, (u3.LocationValueError, u3.ProxySchemeUnknown, u3.SSLError)):
            return FailureKind.FATAL
        if isinstance(exc, u3.ProtocolError):
            cause = exc.args[1] if len(exc.args) > 1 else None
            if isinstance(cause, builtins.TimeoutError):
                return FailureKind.TIMEOUT
            if isinstance(cause, OSError):
                return FailureKind.DISCONNECTED
        return FailureKind.BROKEN
    return None
