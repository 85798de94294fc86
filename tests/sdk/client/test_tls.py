"""https: certificates are verified by default; ``ca_certs`` trusts a private CA."""

from __future__ import annotations

import logging
import random
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eas_sdk._core.retry import RetryPolicy
from eas_sdk.errors import HTTPStatusError, TransportError
from eas_sdk.queue import AsyncQueueClient, QueueClient

from .conftest import TOKEN, Raw
from .fake_eas import FakeEAS

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def tls_server(pki: Path) -> Iterator[FakeEAS]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki / "srv.pem", pki / "srv.key")
    s = FakeEAS(tokens=[TOKEN], ssl_context=ctx).start()
    yield s
    s.stop()


async def test_https_endpoint_with_private_ca(tls_server: FakeEAS, pki: Path, make_client: Any) -> None:
    assert tls_server.url.startswith("https://")
    h = make_client(tls_server.url, "echo", token=TOKEN, ca_certs=str(pki / "ca.pem"))
    assert await h.predict(Raw(b"secure")) == b"secure"
    assert tls_server.predicts[0].auth_ok


async def test_untrusted_certificate_is_refused_without_retries(
    tls_server: FakeEAS, make_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="eas_sdk")
    h = make_client(tls_server.url, "echo", token=TOKEN)
    with pytest.raises(TransportError) as info:
        await h.predict(Raw(b"x"))
    assert "certificate" in str(info.value).lower()
    assert TOKEN not in str(info.value)
    assert tls_server.predicts == []  # nothing was sent
    assert "retrying" not in caplog.text  # a verification failure is final


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_queue_clients_refuse_an_untrusted_certificate_without_retries(
    tls_server: FakeEAS, pki: Path, kind: str
) -> None:
    # The same rule as for predict calls: a verification failure is final. A retry would
    # first ask the policy for its back-off: it is never asked.
    backoffs: list[int] = []

    class Counting(RetryPolicy):
        def backoff(self, retry_index: int, rng: random.Random | None = None) -> float:
            backoffs.append(retry_index)
            return super().backoff(retry_index, rng)

    slow = Counting(retries=5, backoff_base=0.5, backoff_cap=0.5)
    if kind == "sync":
        q = QueueClient(custom_url=tls_server.url + "/api/predict/q")
        q.retry_policy = slow
        with pytest.raises(TransportError) as info:
            q.put(b"x")
        q.close()
    else:
        aq = AsyncQueueClient(custom_url=tls_server.url + "/api/predict/q")
        aq.retry_policy = slow
        with pytest.raises(TransportError) as info:
            await aq.put(b"x")
        await aq.close()
    assert "certificate" in str(info.value).lower()
    assert info.value.attempts == 1 and backoffs == []


async def test_queue_client_with_private_ca_reaches_the_server(tls_server: FakeEAS, pki: Path) -> None:
    # The fake predict server has no queue routes: an HTTP error answer shows TLS worked.
    q = AsyncQueueClient(custom_url=tls_server.url + "/api/predict/q", ca_certs=str(pki / "ca.pem"))
    q.retry_policy = RetryPolicy(retries=0)
    try:
        with pytest.raises(HTTPStatusError):
            await q.attributes()
    finally:
        await q.close()


async def test_watchers_trust_the_private_ca_too(tls_server: FakeEAS, pki: Path) -> None:
    """wss:// with ``ca_certs``: the TLS handshake succeeds and the fake server (which has no
    WebSocket route) refuses the upgrade, which is raised as final."""
    ca = str(pki / "ca.pem")
    q = QueueClient(custom_url=tls_server.url + "/api/predict/q", ca_certs=ca)
    q.init()
    try:
        with pytest.raises(HTTPStatusError) as info:
            next(iter(q.watch(0, 1)))
        assert info.value.code == 405  # its predict route takes POST only
    finally:
        q.close()
    aq = AsyncQueueClient(custom_url=tls_server.url + "/api/predict/q", ca_certs=ca)
    try:
        with pytest.raises(HTTPStatusError) as ainfo:
            await anext(aiter(aq.watch(0, 1)))
        assert ainfo.value.code == 405
    finally:
        await aq.close()
