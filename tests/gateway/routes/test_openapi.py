"""gateway/openapi.json names every route the application mounts, and nothing else: a route
added or removed without its description fails here (the answers themselves are checked
against the description by tests/e2e/test_openapi_e2e.py)."""

from __future__ import annotations

import json
from typing import Any

from gateway.app import create_app
from gateway.config import parse_config
from gateway.fronts.routes.openapi import spec_bytes
from tests.gateway.front.fakes import FakePool, FakeQueues

# aiohttp's catch-all tails carry the service name first, as the description's {service} does.
_TEMPLATES = {"{tail}": "{service}"}
# Catch-all routes answer every method (the queue protocol, a 405 with its own body): the
# description names the methods clients use.
_ANY = "*"


def _mounted() -> dict[str, set[str]]:
    cfg = parse_config({"services": []})
    app = create_app(
        cfg, pool_factory=FakePool, queue_factory=lambda c: FakeQueues(set()), cluster_serving=True
    )
    out: dict[str, set[str]] = {}
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        for raw, name in _TEMPLATES.items():
            path = path.replace(raw, name)
        if route.method != "HEAD":
            out.setdefault(path, set()).add(route.method.lower())
    return out


def test_every_mounted_route_is_described_and_every_described_route_is_mounted() -> None:
    spec: dict[str, Any] = json.loads(spec_bytes())
    described = {
        path: {m for m in ops if m in ("get", "post", "put", "delete")} for path, ops in spec["paths"].items()
    }
    mounted = _mounted()
    assert set(described) == set(mounted)
    for path, methods in mounted.items():
        if _ANY.lower() in methods:
            assert described[path], path
            continue
        assert described[path] == methods, path


def test_every_operation_documents_its_answers() -> None:
    spec = json.loads(spec_bytes())
    assert spec["openapi"].startswith("3.")
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            # Its success: 200, or the sign-in's redirect.
            assert {"200", "303"} & op["responses"].keys(), (method, path)
            for status, answer in op["responses"].items():
                assert answer.get("description"), (method, path, status)
