"""What an EAS signature must carry: a Date in the window, Content-MD5 with a body, the
Content-Type sent; and the optional replay cache."""

from __future__ import annotations

import time
from email.utils import formatdate

import pytest

from eas_sdk._core.auth import signed_headers
from gateway.config import ServiceConfig
from gateway.core import errors
from gateway.core.auth import AuthStatus, ReplayCache, SignaturePolicy, verify
from gateway.core.dataplane import DataPlane

TOKEN = "auth-test-token-7e1d"
PATH = "/api/predict/svc"
BODY = b"payload"


def _signed(date: str | None = None, ctype: str | None = None, body: bytes = BODY) -> dict[str, str]:
    return signed_headers(TOKEN, body, "svc", content_type=ctype, date=date)


def test_a_fresh_signature_passes() -> None:
    assert verify([TOKEN], _signed(), PATH, BODY).ok


@pytest.mark.parametrize("offset_s", [-3600, -901, 901, 86400 * 365])
def test_a_date_outside_the_window_is_refused(offset_s: int) -> None:
    headers = _signed(formatdate(time.time() + offset_s, usegmt=True))
    result = verify([TOKEN], headers, PATH, BODY)
    assert result.status is AuthStatus.STALE
    assert verify([TOKEN], headers, PATH, BODY, SignaturePolicy(max_skew_s=0)).ok  # window off
    assert verify([TOKEN], headers, PATH, BODY, SignaturePolicy(max_skew_s=abs(offset_s) + 60)).ok


@pytest.mark.parametrize("date", ["", "yesterday", "Mon, 99 Foo 2026 99:99:99 GMT"])
def test_a_missing_or_unreadable_date_is_refused(date: str) -> None:
    assert verify([TOKEN], _signed(date), PATH, BODY).status is AuthStatus.STALE


def test_content_md5_is_required_with_a_body() -> None:
    # A client that signs an empty Content-MD5 leaves the body unprotected: refused.
    from eas_sdk._core.auth import eas_authorization, http_date

    date = http_date()
    auth = eas_authorization(TOKEN.encode(), "", "application/octet-stream", date, PATH)
    headers = {"Authorization": auth, "Date": date, "Content-Type": "application/octet-stream"}
    result = verify([TOKEN], headers, PATH, BODY)
    assert result.status is AuthStatus.INVALID and "Content-MD5" in result.reason
    assert verify([TOKEN], headers, PATH, b"").ok  # no body: nothing to digest
    assert verify([TOKEN], headers, PATH, BODY, SignaturePolicy(require_md5=False)).ok


def test_the_signed_content_type_is_the_one_sent() -> None:
    headers = _signed()  # signs application/octet-stream
    headers["Content-Type"] = "application/json"
    assert not verify([TOKEN], headers, PATH, BODY).ok
    assert verify([TOKEN], headers, PATH, BODY, SignaturePolicy(bind_content_type=False)).ok
    del headers["Content-Type"]  # none sent: the call goes on as octet-stream, as signed
    assert verify([TOKEN], headers, PATH, BODY).ok


def test_replay_cache_refuses_the_same_signature_twice() -> None:
    cache = ReplayCache(window_s=900, max_entries=2)
    assert not cache.replayed("a", now=0.0)
    assert cache.replayed("a", now=1.0)
    assert not cache.replayed("b", now=2.0)
    assert not cache.replayed("c", now=3.0)  # full: "a" is forgotten
    assert not cache.replayed("a", now=4.0)
    assert not ReplayCache(900, 10).replayed("x", now=0.0)
    old = ReplayCache(window_s=10, max_entries=10)
    old.replayed("x", now=0.0)
    assert not old.replayed("x", now=100.0)  # expired with the window


def test_dataplane_answers_each_refusal() -> None:
    svc = ServiceConfig(name="svc", processor="python", token=TOKEN)
    plane = DataPlane([svc], {}, replay=ReplayCache(900, 100))
    headers = _signed()
    plane.authenticate(svc, headers, PATH, BODY)
    with pytest.raises(errors.Unauthorized, match="replay"):
        plane.authenticate(svc, headers, PATH, BODY)
    stale = _signed(formatdate(time.time() - 3600, usegmt=True))
    with pytest.raises(errors.Unauthorized, match="window"):
        plane.authenticate(svc, stale, PATH, BODY)
    with pytest.raises(errors.BadDigest):
        plane.authenticate(svc, _signed(), PATH, b"tampered")
