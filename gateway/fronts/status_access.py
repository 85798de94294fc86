"""Who may see the status page (``/status``, its live stream and ``/api/status``).

The page shows worker pids and traffic figures, which are for the machine's operator, so
it is served to:

* loopback callers (a browser or ``eas-gateway status`` on the gateway's machine);
* a caller presenting the admin token (``admin.token``) as ``Authorization: Bearer <token>``
  (scripts, ``eas-gateway status --url URL --token ...``);
* a browser holding the status cookie, which the page's sign-in form
  (``POST /status/login``, the token in the form's body) sets.

The token is never put in a URL (where browser history, proxies and access logs would keep
it) and the cookie does not hold it: the cookie is ``<issued>.<HMAC-SHA256(token, issued)>``,
so it opens the status page only, for ``COOKIE_MAX_AGE_S``, and a new admin token ends
every cookie made with the old one. It is ``HttpOnly`` (no script reads it),
``SameSite=Strict`` (no other site's page sends it) and scoped to ``/status``; ``Secure``
when the call came over TLS (``X-Forwarded-Proto: https`` from the proxy in front counts).
Without an admin token in the config, other callers get 403; with one, a missing or wrong
token gets 401. After a wrong token, the same address gets 429 for
``admin.failed_token_pause_s`` (1 s): a guesser gets one try a second per address, a person
who mistyped does not notice.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import ipaddress
import time
import weakref
from collections import OrderedDict

from aiohttp import web

from gateway.core import errors
from gateway.fronts.admin.api import token_matches
from gateway.fronts.state import GATEWAY_KEY

COOKIE = "eas_status"
COOKIE_PATH = "/status"
COOKIE_MAX_AGE_S = 12 * 3600
LOGIN_PATH = "/status/login"
MAX_LOGIN_BODY = 8192
_FAILED_PEERS_KEPT = 4096


class _Throttle:
    """The addresses that sent a wrong admin token lately (the newest ``_FAILED_PEERS_KEPT``)."""

    def __init__(self, pause_s: float) -> None:
        self.pause_s = pause_s
        self.failed: OrderedDict[str, float] = OrderedDict()

    def check(self, peer: str) -> None:
        last = self.failed.get(peer)
        if last is not None and time.monotonic() - last < self.pause_s:
            raise errors.TooManyRequests("a wrong admin token came from this address just now; wait a second")

    def failure(self, peer: str) -> None:
        self.failed[peer] = time.monotonic()
        self.failed.move_to_end(peer)
        while len(self.failed) > _FAILED_PEERS_KEPT:
            self.failed.popitem(last=False)


_throttles: weakref.WeakKeyDictionary[web.Application, _Throttle] = weakref.WeakKeyDictionary()


def _throttle(request: web.Request) -> _Throttle:
    t = _throttles.get(request.app)
    if t is None:
        admin = request.app[GATEWAY_KEY].config.admin
        t = _throttles[request.app] = _Throttle(admin.failed_token_pause_s if admin is not None else 1.0)
    return t


def admin_token(app: web.Application) -> str | None:
    admin = app[GATEWAY_KEY].config.admin
    return admin.token if admin is not None and admin.token else None


def is_loopback_peer(request: web.Request) -> bool:
    try:
        return ipaddress.ip_address(request.remote or "").is_loopback
    except ValueError:  # a Unix socket's peer, or none
        return False


def cookie_value(token: str, issued: int) -> str:
    mac = hmac.new(token.encode(), f"status-page:{issued}".encode(), hashlib.sha256).hexdigest()
    return f"{issued}.{mac}"


def cookie_valid(value: str | None, token: str, now: float) -> bool:
    if not value:
        return False
    issued, _, _ = value.partition(".")
    if not issued.isdigit() or len(issued) > 12:
        return False
    if not now - COOKIE_MAX_AGE_S <= int(issued) <= now + 60:
        return False
    return hmac.compare_digest(value.encode(), cookie_value(token, int(issued)).encode())


def allowed(request: web.Request) -> bool:
    """Whether this call may see the status page; raises 403 when no token could ever open
    it for this caller (no admin token configured)."""
    if is_loopback_peer(request):
        return True
    token = admin_token(request.app)
    if token is None:
        raise errors.Forbidden(
            "the status page is served to loopback callers, or with the admin token; admin.token is not set"
        )
    throttle, peer = _throttle(request), request.remote or ""
    throttle.check(peer)
    given = request.headers.get("Authorization")
    if token_matches(given, token):
        return True
    if given is not None:
        throttle.failure(peer)
        return False
    return cookie_valid(request.cookies.get(COOKIE), token, time.time())


def check(request: web.Request) -> None:
    """For the stream and the JSON snapshot: 401 (403, see ``allowed``) unless allowed."""
    if not allowed(request):
        raise errors.Unauthorized("invalid or missing admin token")


def sign_in_page(message: str = "", status: int = 401) -> web.Response:
    note = f'<p role="alert">{html.escape(message)}</p>' if message else ""
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Gateway status: sign in</title>'
        "<style>body{font:15px system-ui,sans-serif;margin:3em auto;max-width:26em}"
        "input{font:inherit;width:100%;margin:.4em 0}</style></head><body>"
        "<h1>Gateway status</h1><p>This page is served to the gateway's own machine, or with the "
        f"admin token.</p>{note}"
        f'<form method="post" action="{LOGIN_PATH}"><label for="token">Admin token</label>'
        '<input id="token" name="token" type="password" autocomplete="current-password" autofocus required>'
        '<input type="submit" value="Sign in"></form></body></html>'
    )
    return web.Response(text=body, status=status, content_type="text/html", headers=PAGE_HEADERS)


# The page loads nothing from anywhere else; say so to the browser as well.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "script-src 'self' 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
    "Cache-Control": "no-store",
}


async def login(request: web.Request) -> web.StreamResponse:
    """``POST /status/login`` (form field ``token``): the status cookie and a redirect to the
    page, or the sign-in form again (401)."""
    token = admin_token(request.app)
    if token is None:
        raise errors.Forbidden("signing in needs admin.token in the gateway's config")
    if (request.content_length or 0) > MAX_LOGIN_BODY:
        raise errors.PayloadTooLarge("the sign-in form is larger than expected")
    throttle, peer = _throttle(request), request.remote or ""
    throttle.check(peer)
    form = await request.post()
    given = form.get("token")
    if not isinstance(given, str) or not hmac.compare_digest(given.strip().encode(), token.encode()):
        throttle.failure(peer)
        return sign_in_page("That is not the admin token.")
    resp = web.Response(status=303, headers={"Location": COOKIE_PATH, "Cache-Control": "no-store"})
    secure = request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"
    resp.set_cookie(
        COOKIE, cookie_value(token, int(time.time())), max_age=COOKIE_MAX_AGE_S, path=COOKIE_PATH,
        httponly=True, samesite="Strict", secure=secure,
    )  # fmt: skip
    return resp


__all__ = [
    "COOKIE",
    "LOGIN_PATH",
    "PAGE_HEADERS",
    "allowed",
    "check",
    "cookie_valid",
    "cookie_value",
    "login",
    "sign_in_page",
]
