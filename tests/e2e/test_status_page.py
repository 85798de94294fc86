"""The status page in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, which scripts/test.sh installs when missing) driven by Selenium. The
numbers change under load, queue depth shows, a killed worker shows as restarting, and a
screenshot is saved. ``eas-gateway status`` prints the same figures."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import ROOT, GatewayProcess

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="chromium and chromium-driver are not installed (scripts/test.sh installs them)",
)
SLOW_START = f"{ROOT / 'tests' / 'processors' / 'slow_start.py'}:SlowStart"


@contextmanager
def open_browser() -> Iterator[Any]:
    """Headless Chromium, quit at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1100,1300",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser() -> Iterator[Any]:
    with open_browser() as driver:
        yield driver


def _wait(what: str, check: Callable[[], Any], timeout: float = 15.0) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except StaleElementReferenceException:  # the page redrew it between find and read
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"the page never showed {what}"
        time.sleep(0.1)


def _field(driver: Any, service: str, field: str) -> str:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(
            driver.find_element(By.CSS_SELECTOR, f'[data-service="{service}"][data-field="{field}"]').text
        )
    except StaleElementReferenceException:  # redrawn between find and read
        return ""


def _load(url: str, stop: threading.Event) -> None:
    while not stop.is_set():
        req = urllib.request.Request(url + "/api/predict/svc", data=b"x", method="POST")
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()
        time.sleep(0.01)


def test_the_status_page_is_live_in_a_browser(gateway_factory: Any, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    marker = tmp_path / "slow"
    config = {
        "gateway": {"health_interval_s": 0.2},
        "services": [
            {"name": "svc", "processor": "python", "public": True, "entry": SLOW_START, "workers": 1,
             "config": {"slow_file": str(marker), "start_s": 2}},
            {"name": "jobs", "processor": "queue", "public": True},
        ],
    }  # fmt: skip
    gw: GatewayProcess = gateway_factory(config)
    for i in range(3):
        urllib.request.urlopen(
            urllib.request.Request(gw.url + "/api/predict/jobs", data=b"%d" % i), timeout=5
        )

    browser.get(gw.url + "/status")
    _wait("the live stream", lambda: browser.find_element(By.ID, "live").text == "live")
    assert _field(browser, "svc", "requests_total") == "0"
    for field in ("length", "lag"):
        css = f'[data-queue="jobs"] [data-field="{field}"]'
        _wait(f"the queue's {field}", lambda css=css: browser.find_element(By.CSS_SELECTOR, css).text == "3")

    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(gw.url, stop), daemon=True)
    loader.start()
    try:
        _wait("a request rate", lambda: float(_field(browser, "svc", "rate_rps") or 0) > 0)
        _wait("a latency", lambda: _field(browser, "svc", "p50_ms") not in ("", "-"))
        assert int(_field(browser, "svc", "requests_total")) > 0
    finally:
        stop.set()
        loader.join(10)

    marker.touch()  # the replacement worker takes 2 s to start
    (pid,) = gw.worker_pids("svc")
    os.kill(pid, signal.SIGKILL)
    state = '[data-worker="svc/0"] [data-field="state"]'
    _wait("a restarting worker", lambda: browser.find_element(By.CSS_SELECTOR, state).text == "restarting")
    browser.save_screenshot(str(tmp_path / "status.png"))
    assert (tmp_path / "status.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _field(browser, "svc", "restarts") == "1"
    _wait("the worker ready again", lambda: browser.find_element(By.CSS_SELECTOR, state).text == "ready", 20)

    out = subprocess.run(
        [sys.executable, "-m", "gateway", "status", "--url", gw.url],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "svc" in out.stdout and "worker 0:" in out.stdout and ", 1 restarts" in out.stdout
    assert "queue jobs: depth 3, pending 0, lag 3, 0 consumers" in out.stdout


def _post(url: str, headers: dict[str, str] | None = None) -> int:
    req = urllib.request.Request(url, data=b"x", method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        with exc:
            exc.read()
            return int(exc.code)


def _chart(driver: Any, chart: str, attr: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, f'[data-chart="{chart}"]').get_attribute(attr) or "")


def _pixels(driver: Any, chart: str) -> str:
    script = f"return document.querySelector('[data-chart=\"{chart}\"] canvas').toDataURL()"
    return str(driver.execute_script(script))


def _token_load(url: str, stop: threading.Event) -> None:
    while not stop.is_set():
        _post(url + "/api/predict/svc", {"Authorization": "tok"})


def test_the_charts_show_the_last_hour_kept_by_the_gateway(
    gateway_factory: Any, browser: Any, tmp_path: Path
) -> None:
    """A page opened late draws what happened before it (the history is the gateway's), shows
    refused and unknown-service calls, a service's not-ready reason and last error, and its
    charts (uPlot, served by the gateway) change under load."""
    from selenium.webdriver.common.by import By

    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    config = {
        "gateway": {"status_history_interval_s": 0.5},
        "services": [
            {"name": "svc", "processor": "python", "token": "tok", "entry": SLOW_START, "workers": 1,
             "config": {"slow_file": str(tmp_path / "never")}},
            {"name": "broken", "processor": "onnx", "model": str(junk), "public": True},
        ],
    }  # fmt: skip
    gw: GatewayProcess = gateway_factory(config)
    gw.wait_workers_ready("svc", 1)
    # Before anyone looks: refused calls, calls to a service that does not exist, one to the
    # service that is not ready.
    assert {_post(gw.url + "/api/predict/svc") for _ in range(5)} == {401}
    assert {_post(gw.url + "/api/predict/nope") for _ in range(2)} == {404}
    assert _post(gw.url + "/v2/models/nope/infer") == 404  # every front counts them
    assert _post(gw.url + "/api/predict/broken") == 503

    def history() -> Any:
        status, body = gw.get_json("/api/status/history")
        assert status == 200
        return body

    # Both kinds of call may fall in different samples: wait for the one that has both.
    h = _wait(
        "refusals and unknown-service calls in the history",
        lambda: (
            (h := history())
            and any(h["services"].get("svc", {}).get("refused_rps", ()))
            and any(h["unknown_rps"])
            and h
        ),
        20,
    )
    assert h["interval_s"] == 0.5

    browser.get(gw.url + "/status")
    _wait("the live stream", lambda: browser.find_element(By.ID, "live").text == "live")
    assert _field(browser, "svc", "refused_total") == "5"
    assert browser.find_element(By.ID, "unknown").text == "3"
    reason = _wait("the not-ready reason", lambda: _field(browser, "broken", "reason"))
    assert reason.startswith("not ready: ")
    last = _wait("the last error", lambda: _field(browser, "broken", "last_error"))
    assert last.startswith("last error 503") and "not ready" not in _field(browser, "svc", "reason")
    # The charts draw the minutes before the page was opened.
    _wait("the history's points", lambda: int(_chart(browser, "svc/traffic", "data-points") or 0) > 1)
    _wait("the unknown-service chart", lambda: float(_chart(browser, "gateway/unknown", "data-max") or 0) > 0)
    quiet_max = float(_chart(browser, "svc/traffic", "data-max"))
    quiet = _pixels(browser, "svc/traffic")
    browser.save_screenshot(str(tmp_path / "quiet.png"))

    stop = threading.Event()
    loader = threading.Thread(target=_token_load, args=(gw.url, stop), daemon=True)
    loader.start()
    try:
        _wait(
            "a busier chart", lambda: float(_chart(browser, "svc/traffic", "data-max") or 0) > quiet_max, 20
        )
        _wait("a latency chart", lambda: float(_chart(browser, "svc/latency", "data-max") or 0) > 0, 20)
    finally:
        stop.set()
        loader.join(10)
    assert _pixels(browser, "svc/traffic") != quiet
    browser.save_screenshot(str(tmp_path / "busy.png"))
    busy = (tmp_path / "busy.png").read_bytes()
    assert busy[:8] == b"\x89PNG\r\n\x1a\n" and busy != (tmp_path / "quiet.png").read_bytes()
    # Only what the page loads is served; the vendored library comes with its licence.
    with urllib.request.urlopen(gw.url + "/status/assets/uPlot.LICENSE", timeout=5) as resp:
        assert b"MIT License" in resp.read()
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(gw.url + "/status/assets/..%2Fstatus.html", timeout=5)
    info.value.close()
    assert info.value.code == 404
