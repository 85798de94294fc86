"""The clients' retry rules through MockTransport: no sockets, every decision visible.

The same classified failures drive predict and queue calls, sync and async:
a stale reused connection is re-sent for free, a started response and a TLS
verification failure are final, ``retry_count=0`` is one attempt, and a queue
``get`` that deletes what it reads is never repeated once it may have arrived.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

import pytest

from eas_sdk._core.queue_call import QueueCall
from eas_sdk._core.retry import FailureKind, RetryPolicy, UnlimitedBudget
from eas_sdk._transports import MockTransport, Request, Response, TransportFailure
from eas_sdk.aio_predict import AsyncPredictClient
from eas_sdk.errors import ServiceUnavailableError, TimeoutError, TransportError
from eas_sdk.predict import PredictClient
from eas_sdk.queue import AsyncQueueClient, QueueClient

FAST = RetryPolicy(retries=3, backoff_base=0.001, backoff_cap=0.002)


def script(*answers: Response | BaseException) -> Callable[[Request], Response]:
    """A handler giving ``answers`` in turn (an exception is raised)."""
    left = list(answers)

    def handler(req: Request) -> Response:
        answer = left.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return handler


OK = Response(200, {}, b"ok")
BUSY = Response(503, {}, b"busy")


def stale() -> TransportFailure:
    return TransportFailure(ConnectionResetError(), reused=True)


def predict_client(mock: MockTransport, **kwargs: object) -> PredictClient:
    return PredictClient("127.0.0.1:1", "svc", transport=mock, retry_policy=FAST, **kwargs)  # type: ignore[arg-type]


def test_retry_count_zero_is_one_attempt() -> None:
    mock = MockTransport(script(BUSY))
    with predict_client(mock) as client:
        client.set_retry_count(0)
        with pytest.raises(ServiceUnavailableError):
            client.predict(b"x")
    assert len(mock.requests) == 1


def test_stale_reused_connection_is_resent_free_then_retries_count() -> None:
    mock = MockTransport(script(stale(), BUSY, OK))
    with predict_client(mock) as client:
        client.set_retry_count(1)
        assert client.predict(b"x") == b"ok"
    assert len(mock.requests) == 3
    assert len({r.headers["X-Request-Id"] for r in mock.requests}) == 1


def test_started_response_and_tls_verification_are_final() -> None:
    cut = TransportFailure(ConnectionResetError(), started=True)
    for failure, error in ((cut, TransportError), (ssl.SSLCertVerificationError("bad cert"), TransportError)):
        mock = MockTransport(script(failure, OK))
        with predict_client(mock) as client, pytest.raises(error):
            client.predict(b"x")
        assert len(mock.requests) == 1


async def test_async_predict_client_uses_the_same_rules() -> None:
    mock = MockTransport(script(stale(), TimeoutError("late"), OK))
    async with AsyncPredictClient("127.0.0.1:1", "svc", transport=mock, retry_policy=FAST) as client:
        assert await client.predict(b"x") == b"ok"
    assert len(mock.requests) == 3


def test_queue_deleting_get_is_not_repeated_once_sent() -> None:
    mock = MockTransport(script(TimeoutError("read timed out"), OK))
    q = QueueClient("127.0.0.1:1", "q", transport=mock)
    q.retry_policy = FAST
    with pytest.raises(TimeoutError) as info:
        q.get(auto_delete=True)
    assert "not retried" in str(info.value)
    assert len(mock.requests) == 1 and not mock.requests[0].idempotent


async def test_async_queue_retries_a_failed_connect_and_5xx() -> None:
    mock = MockTransport(script(ConnectionRefusedError(111, "refused"), BUSY, Response(200, {}, b"")))
    q = AsyncQueueClient("127.0.0.1:1", "q", transport=mock)
    q.retry_policy = FAST
    assert await q.get(auto_delete=True) == []
    assert len(mock.requests) == 3


def test_queue_call_decisions() -> None:
    def call(idempotent: bool = True) -> QueueCall:
        return QueueCall(
            "GET", "http://h/q", {}, None, timeout=1.0, now=0.0, policy=FAST, budget=UnlimitedBudget(),
            idempotent=idempotent,
        )  # fmt: skip

    c = call()
    assert c.on_failure(FailureKind.DISCONNECTED, "r", 0.1, reused=True).delay == 0.0  # free re-send
    assert c.retries == 0
    assert c.on_failure(FailureKind.BROKEN, "cut", 0.1, started=True).error is None  # asked again
    assert c.retries == 1
    assert isinstance(c.on_failure(FailureKind.FATAL, "cert", 0.1).error, TransportError)
    assert c.on_response(404, {}, b"no", 0.1).error is not None
    assert c.on_response(200, {}, b"yes", 0.1).body == b"yes"
    once = call(idempotent=False)
    assert once.on_failure(FailureKind.CONNECT, "refused", 0.1, sent=False).error is None
    assert once.on_failure(FailureKind.DISCONNECTED, "reset", 0.1, reused=True).error is not None
    assert call().attempt_timeout == 1.0


@pytest.mark.parametrize(("wait", "expected"), [("0s", 1.0), ("5s", 6.0)])
def test_a_long_poll_gets_its_wait_and_a_second_to_answer(wait: str, expected: float) -> None:
    """A get's attempt timeout is the client's (0.3 s here), or the long poll's wait plus a
    second for the answer when that is longer."""
    mock = MockTransport(script(Response(200, {}, b"")))
    q = QueueClient("127.0.0.1:1", "q", transport=mock)
    q.set_timeout(300)
    q.get(timeout=wait, auto_delete=True)
    assert [r.timeout for r in mock.requests] == [expected]
