"""Plain HTTP calls and readiness waits the pipeline end-to-end tests share."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from tests.e2e.gateway_proc import GatewayProcess


def post(
    gw: GatewayProcess, path: str, doc: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any, Any]:
    """-> (status, JSON body, response headers)."""
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    req = urllib.request.Request(gw.url + path, body, {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), exc.headers


def wait_ready(gw: GatewayProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, _ = gw.get_json("/readyz")
        if status == 200:
            return
        time.sleep(0.1)
    raise AssertionError(f"gateway not ready after {timeout} s:\n{gw.output()[-3000:]}")
