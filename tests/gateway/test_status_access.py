"""Who may read the status page: loopback callers, the admin token as a bearer header, or
the cookie the sign-in form sets (which is not the token and expires). The same rule over
a real non-loopback listener: tests/e2e/test_status_page.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gateway.config import parse_config
from gateway.core import errors
from gateway.fronts import status_access
from gateway.fronts.state import GATEWAY_KEY
from tests.gateway.parts import gateway_parts

TOKEN = "admin-token-0123456789"


class _Transport:
    def __init__(self, peer: tuple[str, int]) -> None:
        self.peer = peer

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default


def _request(peer: str, token: str | None, headers: dict[str, str] | None = None) -> web.Request:
    raw: dict[str, Any] = {"services": [{"name": "svc", "processor": "queue", "public": True}]}
    if token is not None:
        raw["admin"] = {"token": token}
    app = web.Application()
    app[GATEWAY_KEY] = gateway_parts(parse_config(raw))
    return make_mocked_request(
        "GET", "/status", headers=headers, app=app, transport=_Transport((peer, 40000))
    )


@pytest.mark.parametrize("peer", ["127.0.0.1", "::1"])
def test_loopback_callers_need_no_token(peer: str) -> None:
    assert status_access.allowed(_request(peer, None))
    assert status_access.allowed(_request(peer, TOKEN))


def test_elsewhere_without_an_admin_token_configured_is_forbidden() -> None:
    with pytest.raises(errors.Forbidden):
        status_access.allowed(_request("192.0.2.7", None, {"Authorization": f"Bearer {TOKEN}"}))


def test_elsewhere_the_admin_token_opens_it() -> None:
    assert status_access.allowed(_request("192.0.2.7", TOKEN, {"Authorization": f"Bearer {TOKEN}"}))
    assert not status_access.allowed(_request("192.0.2.7", TOKEN))
    assert not status_access.allowed(_request("192.0.2.7", TOKEN, {"Authorization": "Bearer wrong-token"}))
    with pytest.raises(errors.Unauthorized):
        status_access.check(_request("192.0.2.7", TOKEN, {"Authorization": "Bearer wrong-token"}))


def test_the_cookie_is_not_the_token_and_expires() -> None:
    now = int(time.time())
    good = status_access.cookie_value(TOKEN, now)
    assert TOKEN not in good
    assert status_access.allowed(_request("192.0.2.7", TOKEN, {"Cookie": f"{status_access.COOKIE}={good}"}))
    assert status_access.cookie_valid(good, TOKEN, now + 60)
    assert not status_access.cookie_valid(good, TOKEN, now + status_access.COOKIE_MAX_AGE_S + 1)
    assert not status_access.cookie_valid(good, "another-admin-token", now)  # a new token ends it
    forged = f"{now + 1}.{good.partition('.')[2]}"
    for bad in (forged, "", "x.y", f"{now}.", TOKEN):
        assert not status_access.cookie_valid(bad, TOKEN, now)


class _Clock:
    """status_access's view of time: ``monotonic`` moves only when the test says, so a pause
    neither ends early on a stalled machine nor needs a real wait; the wall clock is real."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time()


def test_a_wrong_token_pauses_that_address(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(status_access, "time", clock)
    wrong = _request("192.0.2.7", TOKEN, {"Authorization": "Bearer wrong-token"})
    app = wrong.app

    def again(peer: str, auth: str) -> web.Request:
        return make_mocked_request(
            "GET", "/status", headers={"Authorization": auth}, app=app, transport=_Transport((peer, 40001))
        )

    assert not status_access.allowed(wrong)
    # Even the right token waits out the pause from that address; another address does not.
    with pytest.raises(errors.TooManyRequests) as info:
        status_access.allowed(again("192.0.2.7", f"Bearer {TOKEN}"))
    assert info.value.status == 429 and info.value.headers["Retry-After"] == "1"
    assert status_access.allowed(again("192.0.2.8", f"Bearer {TOKEN}"))
    clock.now += 1.0  # as long as Retry-After said: the pause is over
    assert status_access.allowed(again("192.0.2.7", f"Bearer {TOKEN}"))
