"""The OpenAPI description (gateway/openapi.json, served at /openapi.json) against the real
gateway: schemathesis generates requests for every documented operation, valid and not, and
checks that the gateway answers only documented statuses and content types, with bodies of
the documented shapes, and never a server error. Bounded: a few examples per operation."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.e2e.gateway_proc import ROOT, GatewayProcess

TOKEN = "openapi-token-92b1f7c3"
SPEC = ROOT / "gateway" / "openapi.json"
schema = schemathesis.openapi.from_path(str(SPEC))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, digits_model: Path) -> Iterator[GatewayProcess]:
    config = {
        "services": [{"name": "digits", "processor": "onnx", "model": str(digits_model), "token": TOKEN}]
    }
    proc = GatewayProcess.start(config, tmp_path_factory.mktemp("openapi"))
    try:
        yield proc
    finally:
        proc.kill()


def test_the_gateway_serves_its_description(gw: GatewayProcess) -> None:
    with urllib.request.urlopen(gw.url + "/openapi.json", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("application/json")
        assert json.loads(r.read()) == json.loads(SPEC.read_bytes())


@schema.parametrize()
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_answers_conform_to_the_description(case: schemathesis.Case, gw: GatewayProcess) -> None:
    # The one service's own name and token half of the time, so calls get past find and auth.
    case.call_and_validate(base_url=gw.url, headers={"Authorization": TOKEN}, checks=CHECKS, timeout=30)
