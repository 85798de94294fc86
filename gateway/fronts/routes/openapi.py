"""``GET /openapi.json``: the OpenAPI 3 description of the gateway's REST surface.

The description is a hand-maintained file in the package (``gateway/openapi.json``); the
tests keep it true: every route the application mounts is in it and every documented
route is mounted, and schemathesis checks the real gateway's answers against it.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

SPEC_FILE = "openapi.json"


def spec_bytes() -> bytes:
    return resources.files("gateway").joinpath(SPEC_FILE).read_bytes()


def setup(app: web.Application) -> None:
    body = spec_bytes()

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app.router.add_get("/openapi.json", openapi)


__all__ = ["SPEC_FILE", "setup", "spec_bytes"]
