"""HTTP routes of the gateway: predict (EAS), discovery (direct mode) and admin."""

from __future__ import annotations

from aiohttp import web

from gateway.config import SERVICE_NAME_RE, Config, ServiceConfig
from gateway.errors import InvalidServiceName, ServiceNotFound


def split_service(tail: str) -> tuple[str, str]:
    """``svc/sub/path`` -> (``svc``, ``sub/path``) from the raw (undecoded) path tail."""
    service, _, subpath = tail.partition("/")
    return service, subpath


def lookup_service(config: Config, raw_name: str) -> ServiceConfig:
    """Strict name check on the raw path segment first (400), then existence (404).

    The raw segment is checked undecoded, so ``..%2F``, ``%00``, ``%0d%0a`` and any
    non-ASCII byte (percent-encoded by the URL parser) can never match.
    """
    if not SERVICE_NAME_RE.fullmatch(raw_name):
        raise InvalidServiceName("invalid service name")
    svc = config.service(raw_name)
    if svc is None:
        raise ServiceNotFound(f"service {raw_name!r} not found")
    return svc


def raw_tail(request: web.Request, prefix: str) -> str:
    raw = request.rel_url.raw_path
    return raw[len(prefix) :] if raw.startswith(prefix) else ""
