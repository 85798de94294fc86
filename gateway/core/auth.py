"""Token checks for predict, queue and worker endpoints.

Three forms, all accepted on every service that has a token:
  * ``Authorization: <token>`` (raw token; queue clients, custom_url, old clients)
  * ``Authorization: Bearer <token>`` (the same token as KServe's and Triton's clients send it)
  * ``Authorization: EAS <base64 hmac-sha1>`` (see eas_sdk._core.auth)

What a signature must carry (:class:`SignaturePolicy`, from the gateway's config): a
``Date`` within ``max_skew_s`` of the gateway's clock (default 15 minutes; the reference
Python client labels local time as GMT, so its hosts must run in UTC or the window be
widened), a ``Content-MD5`` whenever there is a body (it must match the body), and the
``Content-Type`` the call is handed on with (no header: ``application/octet-stream``).
A replayed signature is refused only with the optional :class:`ReplayCache`.
Compatibility rules: header values are read as sent, Content-MD5 is compared as a
number (Java drops leading zeros), and with ``bind_content_type`` off a signature that
fails with the sent Content-Type is retried with ``application/octet-stream``.
All comparisons are constant time on bytes.
"""

from __future__ import annotations

import base64
import binascii
import enum
import functools
import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from eas_sdk._core.auth import canonical_resource, content_md5, hmac_digest, string_to_sign
from eas_sdk._core.constants import DEFAULT_CONTENT_TYPE, PREDICT_PATH_PREFIX

MAX_AUTH_HEADER = 4096


class AuthStatus(enum.Enum):
    OK = "ok"
    MISSING = "missing"
    INVALID = "invalid"
    BAD_DIGEST = "bad_digest"
    STALE = "stale"  # a valid signature whose Date is outside the window


@dataclass(frozen=True)
class AuthResult:
    status: AuthStatus
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is AuthStatus.OK


OK = AuthResult(AuthStatus.OK)


@dataclass(frozen=True)
class SignaturePolicy:
    """What an ``EAS`` signature must carry besides a valid HMAC (see the module docstring)."""

    max_skew_s: float = 900.0  # 0: the Date is not checked
    require_md5: bool = True
    bind_content_type: bool = True

    @classmethod
    def of(cls, gateway: Any) -> SignaturePolicy:
        """The policy in a ``GatewayConfig`` (``signature_*`` settings)."""
        d = cls()
        return cls(
            float(getattr(gateway, "signature_max_skew_s", d.max_skew_s)),
            bool(getattr(gateway, "signature_require_md5", d.require_md5)),
            bool(getattr(gateway, "signature_bind_content_type", d.bind_content_type)),
        )


STRICT = SignaturePolicy()


def _date_ok(value: str, max_skew_s: float, now: float) -> bool:
    try:
        sent = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return False
    return abs(sent - now) <= max_skew_s


class ReplayCache:
    """Signatures seen within the Date window: the same signature again is a replay. Bounded:
    past ``max_entries`` the oldest are forgotten (a replay of those is then not caught).
    A client that sends the same body twice within one second (the Date's resolution) signs
    it identically, so its second call is refused too: the cache is off by default."""

    def __init__(self, window_s: float, max_entries: int) -> None:
        self.window_s = max(window_s, 1.0)
        self.max_entries = max_entries
        self._seen: OrderedDict[str, float] = OrderedDict()

    def replayed(self, signature: str, now: float | None = None) -> bool:
        """True when ``signature`` was seen within the window; else remember it."""
        now = time.monotonic() if now is None else now
        seen = self._seen
        while seen:
            oldest, at = next(iter(seen.items()))
            if now - at <= 2 * self.window_s and len(seen) < self.max_entries:
                break
            del seen[oldest]  # expired (a Date may be window_s early or late), or room needed
        if signature in seen:
            return True
        seen[signature] = now
        return False


def _b(value: str) -> bytes:
    # Headers arrive as str (latin-1 decoded by the parser); any byte value is fine here.
    return value.encode("utf-8", "surrogateescape")


def _digest(value: str | bytes) -> bytes:
    return hashlib.sha256(value if isinstance(value, bytes) else _b(value)).digest()


@functools.lru_cache(maxsize=256)
def _token_digests(tokens: tuple[str, ...]) -> tuple[bytes, ...]:
    # Configured tokens are fixed: hash them once, not on every request.
    return tuple(_digest(t) for t in tokens)


def _md5_equal(sent: str, body: bytes | bytearray | memoryview) -> bool:
    try:
        sent_int = int(sent.strip(), 16)
    except ValueError:
        return False
    return hmac.compare_digest(
        sent_int.to_bytes(16, "big") if sent_int < (1 << 128) else b"",
        bytes.fromhex(content_md5(body)),
    )


def replay_cache(gateway: Any) -> ReplayCache | None:
    """The replay cache a ``GatewayConfig`` asks for (``signature_replay_cache`` entries), or None."""
    size = int(getattr(gateway, "signature_replay_cache", 0))
    return ReplayCache(float(getattr(gateway, "signature_max_skew_s", 900.0)), size) if size > 0 else None


def verify(
    tokens: Sequence[str],
    headers: Mapping[str, str],
    path: str,
    body: bytes | bytearray | memoryview | None,
    policy: SignaturePolicy = STRICT,
) -> AuthResult:
    """Check one request against the service's tokens (empty ``tokens``: open service).

    ``path`` is the request path (no query) starting with ``/api/predict/``.
    ``body`` may be None for requests whose body is not signed (GET, WebSocket);
    then only the raw-token scheme can succeed.
    """
    if not tokens:
        return OK
    auth = headers.get("Authorization")
    if auth is None or auth == "":
        return AuthResult(AuthStatus.MISSING, "missing Authorization header")
    if len(auth) > MAX_AUTH_HEADER:
        return AuthResult(AuthStatus.INVALID, "Authorization header too long")

    if auth.startswith("EAS "):
        sig_text = auth[4:]
        try:
            sent_sig = base64.b64decode(sig_text, validate=True)
        except (binascii.Error, ValueError):
            sent_sig = b""
        if len(sent_sig) == 20 and body is not None:
            md5_sent = headers.get("Content-MD5", "")
            date = headers.get("Date", "")
            ctype = headers.get("Content-Type", "")
            resources = [path]
            if not path.startswith(PREDICT_PATH_PREFIX):
                resources.append(canonical_resource(path.lstrip("/")))
            if policy.bind_content_type:
                # The type the call is handed on with: none sent means octet-stream.
                ctypes = [ctype] if ctype else ["", DEFAULT_CONTENT_TYPE]
            else:
                ctypes = [ctype] if ctype == DEFAULT_CONTENT_TYPE else [ctype, DEFAULT_CONTENT_TYPE]
            for token in tokens:
                for resource in resources:
                    for ct in ctypes:
                        expected = hmac_digest(token, string_to_sign("POST", md5_sent, ct, date, resource))
                        if hmac.compare_digest(expected, sent_sig):
                            return _signed_call_ok(policy, md5_sent, date, body)
        # Fall through: an "EAS ..." value may still be someone's raw token.

    # "Bearer <token>" carries the raw token; a raw token that itself starts with "Bearer "
    # still matches as sent.
    candidates = [auth, auth[7:]] if auth[:7].lower() == "bearer " else [auth]
    return _raw_token_ok(tokens, candidates)


def _signed_call_ok(
    policy: SignaturePolicy, md5_sent: str, date: str, body: bytes | bytearray | memoryview
) -> AuthResult:
    """A valid HMAC: now the parts it signed must hold (body digest, Date window)."""
    if md5_sent and not _md5_equal(md5_sent, body):
        return AuthResult(AuthStatus.BAD_DIGEST, "Content-MD5 does not match the body")
    if policy.require_md5 and not md5_sent and len(body):
        return AuthResult(AuthStatus.INVALID, "a signed call with a body needs Content-MD5")
    if policy.max_skew_s and not _date_ok(date, policy.max_skew_s, time.time()):
        return AuthResult(AuthStatus.STALE, "Date is missing or outside the accepted window")
    return OK


def _raw_token_ok(tokens: Sequence[str], candidates: list[str]) -> AuthResult:
    digests = _token_digests(tokens) if isinstance(tokens, tuple) else tuple(_digest(t) for t in tokens)
    matched = False
    for sent in map(_digest, candidates):
        for expected in digests:
            # Evaluate every token so timing does not reveal which one matched.
            matched |= hmac.compare_digest(sent, expected)
    if matched:
        return OK
    return AuthResult(AuthStatus.INVALID, "invalid token or signature")
