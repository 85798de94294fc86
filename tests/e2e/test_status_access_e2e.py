"""The status page from another machine's point of view: the gateway listens on this
machine's non-loopback address and is called there, so the caller is not loopback. Without
the admin token: 401 (the page: its sign-in form); a wrong one: 401; the token as a bearer
header, or the cookie the sign-in form sets: 200, for the page, its live stream and the JSON
snapshot alike. The token never reaches a URL or a log."""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import allow_own_address
from tests.e2e.gateway_proc import ROOT, STARTED_LOGS, GatewayProcess

ADMIN_TOKEN = "status-admin-token-0123456789"


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than loopback, or None."""
    candidates: list[str] = []
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5, check=False)
        candidates += out.stdout.split()
    except OSError:
        pass
    try:
        candidates += [str(i[4][0]) for i in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        pass
    for addr in candidates:
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            continue
        if ip.version == 4 and not ip.is_loopback and not ip.is_link_local:
            return addr
    return None


HOST = non_loopback_address()
pytestmark = pytest.mark.skipif(HOST is None, reason="this machine has no non-loopback IPv4 address")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    assert HOST is not None
    allow_own_address(HOST)  # `hostname -I`'s: an address of this machine
    config = {
        # Wrong tokens follow one another here; the pause after one is tested on its own.
        "admin": {"port": 0, "token": ADMIN_TOKEN, "failed_token_pause_s": 0},
        "services": [{"name": "jobs", "processor": "queue", "token": "jobs-token-0123456789"}],
    }
    proc = GatewayProcess.start(
        config, tmp_path_factory.mktemp("status-access"), env={"EASGW_LOOPBACK_ONLY": "0"}, host=HOST
    )
    STARTED_LOGS[-1] = (STARTED_LOGS[-1][0], (*STARTED_LOGS[-1][1], ADMIN_TOKEN))
    try:
        yield proc
    finally:
        proc.stop()


def _call(
    gw: GatewayProcess,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(gw.host, gw.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        # The live stream never ends: its first event is enough.
        data = resp.read1(65536) if path == "/status/events" and resp.status == 200 else resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


PATHS = ("/status", "/status/events", "/api/status")


@pytest.mark.parametrize("path", PATHS)
def test_without_the_token_it_is_refused(gw: GatewayProcess, path: str) -> None:
    status, headers, body = _call(gw, "GET", path)
    assert status == 401
    if path == "/status":  # a browser gets the sign-in form
        assert headers["content-type"].startswith("text/html")
        assert b'action="/status/login"' in body and b'type="password"' in body
    else:
        assert json.loads(body)["code"] == "Unauthorized"
    status, _, _ = _call(gw, "GET", path, {"Authorization": "Bearer not-the-admin-token"})
    assert status == 401
    status, _, _ = _call(gw, "GET", path, {"Cookie": "eas_status=1.forged"})
    assert status == 401


@pytest.mark.parametrize("path", PATHS)
def test_the_admin_token_opens_it(gw: GatewayProcess, path: str) -> None:
    status, headers, body = _call(gw, "GET", path, {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert status == 200, body
    if path == "/status":
        assert b'new EventSource("/status/events")' in body
    elif path == "/status/events":
        assert headers["content-type"] == "text/event-stream"
        assert body.startswith(b"event: status\ndata: {")
    else:
        assert [s["name"] for s in json.loads(body)["services"]] == ["jobs"]


def test_the_sign_in_form_sets_a_cookie_that_opens_the_page_and_its_stream(gw: GatewayProcess) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, _, body = _call(
        gw, "POST", "/status/login", form, urllib.parse.urlencode({"token": "wrong"}).encode()
    )
    assert status == 401 and b"not the admin token" in body
    status, headers, _ = _call(
        gw, "POST", "/status/login", form, urllib.parse.urlencode({"token": ADMIN_TOKEN}).encode()
    )
    assert status == 303 and headers["location"] == "/status"
    cookie = headers["set-cookie"]
    assert ADMIN_TOKEN not in cookie
    attributes = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "samesite", "path", "max-age"} <= attributes and "Path=/status" in cookie
    assert "SameSite=Strict" in cookie
    value = cookie.split(";")[0]
    for path in ("/status", "/status/events"):
        status, _, body = _call(gw, "GET", path, {"Cookie": value})
        assert status == 200, body


def test_eas_gateway_status_reads_it_with_the_token(gw: GatewayProcess) -> None:
    argv = [sys.executable, "-m", "gateway", "status", "--url", gw.url]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 1 and "401" in out.stderr
    out = subprocess.run(
        [*argv, "--token", ADMIN_TOKEN], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "jobs" in out.stdout


def test_a_browser_elsewhere_signs_in_and_sees_it_live(gw: GatewayProcess, tmp_path: Path) -> None:
    from tests.e2e.test_status_page import CHROMEDRIVER, CHROMIUM, open_browser

    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("chromium and chromium-driver are not installed (scripts/test.sh installs them)")
    from selenium.webdriver.common.by import By

    from tests.e2e.test_status_page import _wait

    with open_browser() as browser:
        browser.get(gw.url + "/status")
        field = browser.find_element(By.ID, "token")
        field.send_keys(ADMIN_TOKEN)
        field.submit()
        _wait("the live stream", lambda: browser.find_element(By.ID, "live").text == "live")
        assert browser.current_url == gw.url + "/status"  # no token in the address
        assert browser.find_element(By.CSS_SELECTOR, '[data-service="jobs"][data-field="requests_total"]')
        browser.save_screenshot(str(tmp_path / "signed-in.png"))
    assert not any(ADMIN_TOKEN in p.read_text(errors="replace") for p in gw.workdir.glob("*.log"))


def test_the_token_reaches_no_log(gw: GatewayProcess) -> None:
    _call(gw, "GET", "/status", {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    _call(gw, "GET", "/api/status", {"Authorization": f"Bearer {ADMIN_TOKEN}x"})
    logs: Any = [p.read_text(errors="replace") for p in gw.workdir.glob("*.log")]
    assert logs and not any(ADMIN_TOKEN in text for text in logs)
    assert any("/api/status" in text for text in logs)  # the access log did see the calls
