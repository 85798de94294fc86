"""HTTP routes of the gateway: predict (EAS), discovery (direct mode) and admin."""

from __future__ import annotations

from aiohttp import web


def split_service(tail: str) -> tuple[str, str]:
    """``svc/sub/path`` -> (``svc``, ``sub/path``) from the raw (undecoded) path tail."""
    service, _, subpath = tail.partition("/")
    return service, subpath


def raw_tail(request: web.Request, prefix: str) -> str:
    raw = request.rel_url.raw_path
    return raw[len(prefix) :] if raw.startswith(prefix) else ""
