"""Plain HTTP calls and readiness waits the pipeline end-to-end tests share."""

from __future__ import annotations

import importlib.util
import json
import time
import urllib.error
import urllib.request
from typing import Any

from tests.e2e.gateway_proc import ROOT, GatewayProcess

SAMPLES = ROOT / "samples" / "pipelines"


def sample_client() -> Any:
    """The sample pipelines' client module, under a name of its own: a bare ``client`` on
    sys.path would shadow the test packages of that name."""
    spec = importlib.util.spec_from_file_location("pipeline_sample_client", SAMPLES / "client.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def post_raw(gw: GatewayProcess, path: str, body: bytes) -> tuple[int, bytes]:
    """A protobuf (or any binary) body -> (status, the answer's bytes)."""
    req = urllib.request.Request(gw.url + path, body, {"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
