"""The admin API's routes, its OpenAPI description and its token check."""

from __future__ import annotations

from gateway.app import create_app
from gateway.config import AdminConfig, Config, GatewayConfig
from gateway.fronts.admin.api import create_admin_app, token_matches
from gateway.fronts.admin.openapi import OPENAPI


def test_the_openapi_description_lists_exactly_the_routes() -> None:
    main = create_app(Config(GatewayConfig(), (), admin=AdminConfig(token="t")))
    admin = create_admin_app(main, dict)
    routes = {
        (r.method.lower(), r.resource.canonical)
        for r in admin.router.routes()
        if r.resource is not None and r.method != "HEAD"
    }
    described = {
        (method, path) for path, item in OPENAPI["paths"].items() for method in item if method != "parameters"
    }
    assert described == routes - {("get", "/admin/openapi.json")}


def test_token_forms() -> None:
    assert token_matches("Bearer s3cret", "s3cret")
    assert token_matches("bearer s3cret", "s3cret")
    assert token_matches("s3cret", "s3cret")
    assert not token_matches(None, "s3cret")
    assert not token_matches("Bearer s3cre", "s3cret")
    assert not token_matches("EAS s3cret", "s3cret")
