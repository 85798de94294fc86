"""One error tree for every client: the same failure gives the same type, code, status and
message shape from PredictClient, AsyncPredictClient, QueueClient and AsyncQueueClient, and
messages are text whatever shape the server's error body has."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import pytest

from eas_sdk import AsyncPredictClient, AsyncQueueClient, PredictClient, QueueClient, StringRequest
from eas_sdk.errors import (
    ConnectError,
    GatewayTimeoutError,
    HTTPStatusError,
    NotFoundError,
    PredictException,
    QueueFullError,
    ServerHTTPError,
    TransportError,
    error_for_status,
    parse_error_body,
)
from eas_sdk.exception import PredictException as CompatPredictException


def _refused_url() -> str:
    """An address where nothing listens: bound, then closed, so a connect is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _queue(cls: Any, url: str) -> Any:
    client = cls(url, "svc")
    client.set_retry_count(1)
    return client


def _sync_calls(url: str) -> dict[str, Callable[[], Any]]:
    return {
        "predict": lambda: PredictClient(url, "svc", retry_count=1).predict(StringRequest(b"x")),
        "queue put": lambda: _queue(QueueClient, url).put(b"x"),
        "queue get": lambda: _queue(QueueClient, url).get(),
    }


async def _async_calls(url: str) -> dict[str, PredictException]:
    calls = {
        "async predict": lambda: AsyncPredictClient(url, "svc", retry_count=1).predict(StringRequest(b"x")),
        "async queue put": lambda: _queue(AsyncQueueClient, url).put(b"x"),
        "async queue get": lambda: _queue(AsyncQueueClient, url).get(),
    }
    errors = {}
    for name, call in calls.items():
        with pytest.raises(PredictException) as info:
            await call()
        errors[name] = info.value
    return errors


def test_connection_refused_is_the_same_error_from_every_client() -> None:
    url = _refused_url()
    errors: dict[str, PredictException] = {}
    for name, call in _sync_calls(url).items():
        with pytest.raises(PredictException) as info:
            call()
        errors[name] = info.value
    errors.update(asyncio.run(_async_calls(url)))
    for name, err in errors.items():
        assert type(err) is ConnectError, (name, err)
        assert isinstance(err, TransportError) and isinstance(err, CompatPredictException)
        assert (err.code, err.status) == (500, None), (name, err.code, err.status)
        assert isinstance(err.message, str) and err.message.startswith(f"url: {url}/api/predict/svc"), name
        assert "Connect" in err.message and err.attempts == 2, (name, err)  # retry_count=1
        assert str(err).startswith("Code: 500, Message: url: "), name


@pytest.mark.parametrize(
    ("body", "message", "error_code", "request_id"),
    [
        (b'{"code": "ServiceNotFound", "message": "service \'x\' not found", "request_id": "r1"}',
         "service 'x' not found", "ServiceNotFound", "r1"),
        (b'{"error": "model \'m\' is not ready"}', "model 'm' is not ready", None, None),
        (b"queue 'q' not found\n", "queue 'q' not found", None, None),
        (b"\xff\xfe not utf-8", "\ufffd\ufffd not utf-8", None, None),
        (b"", "Not Found", None, None),
        (b'{"detail": 3}', '{"detail": 3}', None, None),
        (b"[1, 2]", "[1, 2]", None, None),
    ],
)  # fmt: skip
def test_every_error_body_shape_gives_text(
    body: bytes, message: str, error_code: str | None, request_id: str | None
) -> None:
    assert parse_error_body(404, body) == (message, error_code, request_id)
    err = error_for_status(404, body, {}, "sent-id", 2)
    assert isinstance(err, NotFoundError) and err.message == message and err.body == body
    assert err.request_id == (request_id or "sent-id") and err.attempts == 2 and err.status == 404
    assert str(err) == f"Code: 404, Message: {message}"


def test_the_servers_request_id_header_wins_and_statuses_map_to_types() -> None:
    err = error_for_status(504, b"late", {"X-Request-Id": "from-server"}, "sent-id")
    assert isinstance(err, GatewayTimeoutError) and err.request_id == "from-server"
    assert isinstance(error_for_status(450, b""), QueueFullError)
    assert error_for_status(450, b"").message == "HTTP status 450"
    assert type(error_for_status(599, b"x")) is ServerHTTPError
    assert type(error_for_status(302, b"x")) is HTTPStatusError
    long = error_for_status(500, b"a" * 10_000)
    assert len(long.message) < 4100 and len(long.body) == 10_000


def test_the_original_constructor_and_str_still_work() -> None:
    err = PredictException(500, "boom")
    assert (err.code, err.message, err.status) == (500, "boom", None)
    assert err.request_id is None and err.attempts is None and err.error_code is None
    assert str(err) == "Code: 500, Message: boom"
    assert repr(err) == "PredictException(code=500, message='boom')"
    assert "attempts=3" in repr(ConnectError("refused", attempts=3))
