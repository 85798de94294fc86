"""What an EAS signature must carry: a Date in the window, Content-MD5 with a body, the
Content-Type sent; and the optional replay cache."""

from __future__ import annotations

import time
from email.utils import formatdate

import pytest

from eas_sdk._core.auth import signed_headers
from gateway.config import ConfigError, GatewayConfig, ServiceConfig, parse_config
from gateway.core import errors
from gateway.core.auth import AuthStatus, ReplayCache, SignaturePolicy, check_date, verify
from gateway.core.dataplane import DataPlane

TOKEN = "auth-test-token-7e1d"
PATH = "/api/predict/svc"
BODY = b"payload"


def _signed(date: str | None = None, ctype: str | None = None, body: bytes = BODY) -> dict[str, str]:
    return signed_headers(TOKEN, body, "svc", content_type=ctype, date=date)


def test_a_fresh_signature_passes() -> None:
    assert verify([TOKEN], _signed(), PATH, BODY).ok


# Fixed instants: the Date has a resolution of one second, so each edge is exact.
NOW = 1_750_000_000.0
BEHIND = 12 * 3600 + 15 * 60  # UTC-12 and a quarter of an hour
AHEAD = 14 * 3600 + 15 * 60  # UTC+14 and a quarter of an hour


def _date(offset_s: float) -> str:
    return formatdate(NOW + offset_s, usegmt=True)


@pytest.mark.parametrize("offset_s", [-BEHIND, -8 * 3600, -901, 0, 901, 8 * 3600, AHEAD])
def test_the_default_window_takes_every_time_zone(offset_s: int) -> None:
    """A reference client sends its local time labelled GMT: off by its zone's offset."""
    assert check_date(_date(offset_s), SignaturePolicy(), NOW).ok


@pytest.mark.parametrize("offset_s", [-BEHIND - 1, AHEAD + 1, -86400, -2 * 86400, 86400 * 365])
def test_past_any_time_zone_is_refused_naming_the_skew_and_the_setting(offset_s: int) -> None:
    result = check_date(_date(offset_s), SignaturePolicy.of(GatewayConfig()), NOW)
    assert result.status is AuthStatus.STALE
    assert f"skew {offset_s:+d} s" in result.reason
    assert "gateway.signature_max_skew_s" in result.reason
    assert "-12 h 15 min to +14 h 15 min" in result.reason


def test_a_capture_from_two_days_ago_is_refused_by_verify() -> None:
    stale = _signed(formatdate(time.time() - 2 * 86400, usegmt=True))
    result = verify([TOKEN], stale, PATH, BODY)
    assert result.status is AuthStatus.STALE
    assert "2 d 0 h 0 min behind" in result.reason and "signature_max_skew_s" in result.reason
    # A zone's offset either way passes verify too (a margin of a minute for the clock moving).
    for offset_s in (-BEHIND + 60, AHEAD - 60):
        assert verify([TOKEN], _signed(formatdate(time.time() + offset_s, usegmt=True)), PATH, BODY).ok


@pytest.mark.parametrize("offset_s", [-900, 900])
def test_a_narrowed_window_takes_a_quarter_of_an_hour(offset_s: int) -> None:
    assert check_date(_date(offset_s), SignaturePolicy(max_skew_s=900), NOW).ok


@pytest.mark.parametrize("offset_s", [-901, 901, 8 * 3600, -8 * 3600])
def test_a_narrowed_window_refuses_a_local_time_client(offset_s: int) -> None:
    policy = SignaturePolicy.of(GatewayConfig(signature_max_skew_s=900.0))
    result = check_date(_date(offset_s), policy, NOW)
    assert result.status is AuthStatus.STALE
    assert f"skew {offset_s:+d} s" in result.reason
    assert "-15 min to +15 min" in result.reason and "gateway.signature_max_skew_s" in result.reason
    assert check_date(_date(offset_s), SignaturePolicy(max_skew_s=0), NOW).ok  # window off


def test_a_service_sets_its_own_window() -> None:
    gateway = SignaturePolicy.of(GatewayConfig())
    narrow = ServiceConfig(name="narrow", processor="python", token=TOKEN, signature_max_skew_s=900.0)
    assert gateway.for_service(ServiceConfig(name="svc", processor="python", token=TOKEN)) is gateway
    result = check_date(_date(8 * 3600), gateway.for_service(narrow), NOW)
    assert result.status is AuthStatus.STALE
    assert "services[narrow].signature_max_skew_s" in result.reason
    # And a service may widen the gateway's narrowed window back.
    wide = ServiceConfig(name="wide", processor="python", token=TOKEN, signature_max_skew_s="any_zone")
    narrowed = SignaturePolicy.of(GatewayConfig(signature_max_skew_s=900.0))
    assert check_date(_date(8 * 3600), narrowed.for_service(wide), NOW).ok


def test_the_window_setting_is_validated() -> None:
    doc = {"services": [{"name": "q", "processor": "queue", "token": TOKEN}]}
    assert parse_config(doc).gateway.signature_max_skew_s == "any_zone"
    cfg = parse_config({**doc, "gateway": {"signature_max_skew_s": 900}})
    assert cfg.gateway.signature_max_skew_s == 900.0
    for bad in ("soon", -1, float("inf"), True):
        with pytest.raises(ConfigError, match=r"gateway\.signature_max_skew_s: expected 'any_zone' or"):
            parse_config({**doc, "gateway": {"signature_max_skew_s": bad}})
        service = {**doc["services"][0], "signature_max_skew_s": bad}
        with pytest.raises(ConfigError, match=r"\(q\)\.signature_max_skew_s: expected 'any_zone' or"):
            parse_config({"services": [service]})


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
    cache = ReplayCache(keep_s=1800, max_entries=2)
    assert not cache.replayed("a", now=0.0)
    assert cache.replayed("a", now=1.0)
    assert not cache.replayed("b", now=2.0)
    assert not cache.replayed("c", now=3.0)  # full: "a" is forgotten
    assert not cache.replayed("a", now=4.0)
    assert not ReplayCache(1800, 10).replayed("x", now=0.0)
    old = ReplayCache(keep_s=20, max_entries=10)
    old.replayed("x", now=0.0)
    assert old.replayed("x", now=20.0)
    assert not old.replayed("x", now=20.5)  # acceptable no longer: forgotten


def test_replay_cache_keeps_a_signature_while_the_window_could_accept_it() -> None:
    """Under the default window a signature is acceptable for 26.5 hours from its Date's
    earliest moment: a replay a day later is still caught."""
    from gateway.core.auth import keep_for

    assert keep_for(SignaturePolicy()) == (12 + 14) * 3600 + 1800
    assert keep_for(SignaturePolicy(max_skew_s=900)) == 1800
    cache = ReplayCache(keep_for(SignaturePolicy()), 10)
    cache.replayed("sig", now=0.0)
    assert cache.replayed("sig", now=86400.0)


def test_dataplane_answers_each_refusal() -> None:
    svc = ServiceConfig(name="svc", processor="python", token=TOKEN)
    plane = DataPlane([svc], {}, replay=ReplayCache(900, 100))
    headers = _signed()
    plane.authorize(svc, headers, PATH, BODY)
    with pytest.raises(errors.Unauthorized, match="replay"):
        plane.authorize(svc, headers, PATH, BODY)
    stale = _signed(formatdate(time.time() - 2 * 86400, usegmt=True))
    with pytest.raises(errors.Unauthorized, match=r"skew -1728\d\d s.*signature_max_skew_s"):
        plane.authorize(svc, stale, PATH, BODY)
    # A service's own narrowed window: a client in UTC+8 that sends local time is refused.
    narrow = ServiceConfig(name="narrow", processor="python", token=TOKEN, signature_max_skew_s=900.0)
    plane.set_service(narrow)
    shanghai = signed_headers(TOKEN, BODY, "narrow", date=formatdate(time.time() + 8 * 3600, usegmt=True))
    with pytest.raises(errors.Unauthorized, match=r"services\[narrow\]\.signature_max_skew_s"):
        plane.authorize(narrow, shanghai, "/api/predict/narrow", BODY)
    with pytest.raises(errors.BadDigest):
        plane.authorize(svc, _signed(), PATH, b"tampered")
