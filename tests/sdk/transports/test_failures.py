"""One classifier for every transport exception (predict and queue, sync and async)."""

from __future__ import annotations

import http.client
import socket
import ssl

import aiohttp
import pytest
import urllib3.exceptions as u3

from eas_sdk._core.failures import classify, describe
from eas_sdk._core.retry import FailureKind
from eas_sdk._transports.http11 import ProtocolError

K = FailureKind


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ssl.SSLCertVerificationError("certificate verify failed"), K.FATAL),
        (ssl.SSLError("wrong version number"), K.FATAL),
        (ssl.SSLEOFError("eof"), K.DISCONNECTED),
        (ValueError("bad URL"), K.FATAL),
        (TimeoutError("timed out"), K.TIMEOUT),
        (ConnectionRefusedError(111, "refused"), K.CONNECT),
        (socket.gaierror(-2, "Name or service not known"), K.CONNECT),
        (ConnectionResetError(104, "reset"), K.DISCONNECTED),
        (BrokenPipeError(32, "broken pipe"), K.DISCONNECTED),
        (http.client.RemoteDisconnected("closed"), K.DISCONNECTED),
        (ProtocolError("bad status line"), K.BROKEN),
        (u3.NewConnectionError(None, "refused"), K.CONNECT),  # type: ignore[arg-type]
        (u3.ReadTimeoutError(None, "/", "read timed out"), K.TIMEOUT),  # type: ignore[arg-type]
        (u3.SSLError("verify failed"), K.FATAL),
        (aiohttp.ServerDisconnectedError(), K.DISCONNECTED),
        (aiohttp.InvalidURL("x"), K.FATAL),
    ],
)
def test_each_exception_has_one_kind(exc: BaseException, kind: FailureKind) -> None:
    assert classify(exc) is kind


def test_a_failure_while_connecting_is_a_connect_failure_unless_final() -> None:
    assert classify(ConnectionResetError(), connecting=True) is K.CONNECT
    assert classify(TimeoutError(), connecting=True) is K.TIMEOUT
    assert classify(ssl.SSLCertVerificationError(), connecting=True) is K.FATAL


def test_describe() -> None:
    assert describe(TimeoutError("late")) == "TimeoutError: late"
    assert describe(ConnectionResetError()) == "ConnectionResetError"
