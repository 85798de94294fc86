"""The EAS signature's Date window against a real gateway and the real ``eas-prediction`` client.

The reference client signs its local time labelled GMT, so outside UTC its Date is off by
its zone's offset. The default window takes every real zone; a capture signed two days ago
is still refused, and a service that narrows the window to 15 minutes refuses the client
in UTC+8 with a message naming the setting.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from email.utils import formatdate
from typing import Any

import pytest

from eas_sdk._core.auth import signed_headers
from tests.e2e.gateway_proc import ECHO_ENTRY, GatewayProcess
from tests.eas_reference import run_reference

TOKEN = "e2e-clock-skew-token-3b9d41"

# One signed call per service with the reference client; prints the zone's offset it ran
# under (so a missing zone database cannot make the test pass in UTC), and each call's
# status and body.
REFERENCE_CODE = r"""
import json, sys, time
from eas_prediction import PredictClient, PredictException, StringRequest
endpoint, token = sys.argv[1], sys.argv[2]
out = {"offset": time.strftime("%z")}
for service in sys.argv[3:]:
    client = PredictClient(endpoint, service)
    client.set_token(token)
    client.set_retry_count(1)
    client.init()
    try:
        body = client.predict(StringRequest("hello from " + service)).response_data
        out[service] = [200, body.decode()]
    except PredictException as exc:
        message = exc.message
        out[service] = [exc.code, message.decode() if isinstance(message, bytes) else str(message)]
    client.destroy()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "services": [
            {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, "token": TOKEN},
            # Narrowed for clients that send true GMT: 15 minutes either way.
            {
                "name": "narrow",
                "processor": "python",
                "entry": ECHO_ENTRY,
                "token": TOKEN,
                "signature_max_skew_s": 900,
            },
        ]
    }
    proc = GatewayProcess.start(config, tmp_path_factory.mktemp("gw-clock-skew"))
    try:
        proc.wait_workers_ready("echo", 1)
        proc.wait_workers_ready("narrow", 1)
        yield proc
    finally:
        proc.kill()


def _reference(gw: GatewayProcess, zone: str, *services: str) -> dict[str, Any]:
    proc = run_reference(REFERENCE_CODE, gw.endpoint, TOKEN, *services, env={"TZ": zone}, timeout=60)
    result: dict[str, Any] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return result


@pytest.mark.compat
@pytest.mark.parametrize(
    ("zone", "offsets"), [("Asia/Shanghai", {"+0800"}), ("America/Los_Angeles", {"-0700", "-0800"})]
)
def test_the_reference_client_is_accepted_in_any_time_zone(
    gw: GatewayProcess, zone: str, offsets: set[str]
) -> None:
    result = _reference(gw, zone, "echo")
    assert result["offset"] in offsets, f"the client did not run under {zone}: {result}"
    assert result["echo"] == [200, "hello from echo"], result


@pytest.mark.compat
def test_a_narrowed_service_refuses_the_client_in_shanghai_naming_the_setting(gw: GatewayProcess) -> None:
    result = _reference(gw, "Asia/Shanghai", "narrow")
    assert result["offset"] == "+0800", result
    status, message = result["narrow"]
    assert status == 401, result
    # About 8 hours ahead (the call itself takes a moment), and the setting to change.
    assert "ahead of the gateway's clock (skew +28" in message, message
    assert "services[narrow].signature_max_skew_s" in message, message


def _post(gw: GatewayProcess, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        conn.request("POST", "/api/predict/echo", body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_signed_capture_from_two_days_ago_is_refused_with_its_skew(gw: GatewayProcess) -> None:
    body = b"captured two days ago"
    captured = signed_headers(TOKEN, body, "echo", date=formatdate(time.time() - 2 * 86400, usegmt=True))
    status, answer = _post(gw, captured, body)
    assert status == 401, answer
    message = json.loads(answer)["message"]
    assert "2 d 0 h 0 min behind the gateway's clock (skew -1728" in message, message
    assert "gateway.signature_max_skew_s" in message, message
    # The same call signed now passes: only its Date differs.
    fresh = signed_headers(TOKEN, body, "echo")
    assert _post(gw, fresh, body) == (200, body)
