"""Token checks for predict, queue and worker endpoints.

Three forms, all accepted on every service that has a token:
  * ``Authorization: <token>`` (raw token; queue clients, custom_url, old clients)
  * ``Authorization: Bearer <token>`` (the same token as KServe's and Triton's clients send it)
  * ``Authorization: EAS <base64 hmac-sha1>`` (see eas_sdk._core.auth)

What a signature must carry (:class:`SignaturePolicy`, from the gateway's config and the
service's): a ``Date`` inside the accepted window around the gateway's clock, a
``Content-MD5`` whenever there is a body (it must match the body), and the ``Content-Type``
the call is handed on with (no header: ``application/octet-stream``).
The default window (``any_zone``) takes every real time zone's offset, from 12 h 15 min
behind to 14 h 15 min ahead: the reference clients (``eas-prediction`` for Python and Go)
send their local time labelled GMT, so a client in UTC+8 sends a Date 8 hours ahead. A
capture from yesterday is still refused. Operators whose clients all send true GMT narrow
the window to a number of seconds either way (900: 15 minutes). A refusal names the skew it
measured and the setting. A replayed signature is refused only with the optional
:class:`ReplayCache`.
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
import math
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime

from eas_sdk._core.auth import canonical_resource, content_md5, hmac_digest, string_to_sign
from eas_sdk._core.constants import DEFAULT_CONTENT_TYPE, PREDICT_PATH_PREFIX
from gateway.config import GatewayConfig, ServiceConfig
from gateway.config.values import ANY_ZONE

MAX_AUTH_HEADER = 4096
# The default Date window: the offsets of real time zones (UTC-12 to UTC+14), each widened by
# a quarter of an hour for a client's own clock error.
ZONE_BEHIND_S = 12 * 3600 + 900
ZONE_AHEAD_S = 14 * 3600 + 900
SKEW_SETTING = "signature_max_skew_s"


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

    # ANY_ZONE, or seconds either way of the gateway's clock (0: the Date is not checked).
    max_skew_s: float | str = ANY_ZONE
    require_md5: bool = True
    bind_content_type: bool = True
    # Where max_skew_s comes from, as a refusal names it.
    setting: str = SKEW_SETTING

    @classmethod
    def of(cls, gateway: GatewayConfig) -> SignaturePolicy:
        """The policy in a ``GatewayConfig`` (``signature_*`` settings)."""
        return cls(
            gateway.signature_max_skew_s,
            bool(gateway.signature_require_md5),
            bool(gateway.signature_bind_content_type),
            f"gateway.{SKEW_SETTING}",
        )

    def for_service(self, service: ServiceConfig) -> SignaturePolicy:
        """This policy with the service's own ``signature_max_skew_s`` when it sets one."""
        own = service.signature_max_skew_s
        if own is None:
            return self
        return replace(self, max_skew_s=own, setting=f"services[{service.name}].{SKEW_SETTING}")

    @property
    def window(self) -> tuple[float, float] | None:
        """(seconds a Date may be behind, seconds it may be ahead of the clock); None: unchecked."""
        if self.max_skew_s == ANY_ZONE:
            return ZONE_BEHIND_S, ZONE_AHEAD_S
        seconds = float(self.max_skew_s)
        return (seconds, seconds) if seconds else None

    def describe(self) -> str:
        """The window in words, as a refusal states it."""
        if self.max_skew_s == ANY_ZONE:
            return f"{_span(-ZONE_BEHIND_S)} to {_span(ZONE_AHEAD_S)} (any time zone's offset)"
        seconds = float(self.max_skew_s)
        return f"{_span(-seconds)} to {_span(seconds)}"


STRICT = SignaturePolicy()


def _span(seconds: float) -> str:
    """A signed duration in words: ``+14 h 15 min``, ``-2 d 0 h 1 min``, ``+40 s``."""
    sign = "-" if seconds < 0 else "+"
    left = round(abs(seconds))
    days, left = divmod(left, 86400)
    hours, left = divmod(left, 3600)
    minutes, secs = divmod(left, 60)
    if days:
        return f"{sign}{days} d {hours} h {minutes} min"
    if hours:
        return f"{sign}{hours} h {minutes} min"
    if minutes:
        return f"{sign}{minutes} min" + (f" {secs} s" if secs else "")
    return f"{sign}{secs} s"


def check_date(value: str, policy: SignaturePolicy, now: float) -> AuthResult:
    """The signed ``Date`` against the policy's window at ``now`` (Unix seconds). A refusal
    says how far off the Date is and which setting sets the window: it follows a valid HMAC,
    so it tells nothing to a caller without the token."""
    window = policy.window
    if window is None:
        return OK
    try:
        sent = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return AuthResult(AuthStatus.STALE, "the Date header is missing or not an HTTP date")
    skew = sent - now
    behind, ahead = window
    if -behind <= skew <= ahead:
        return OK
    where = "ahead of" if skew > 0 else "behind"
    return AuthResult(
        AuthStatus.STALE,
        f"the Date is {_span(skew)[1:]} {where} the gateway's clock (skew {skew:+.0f} s), outside the "
        f"accepted window of {policy.describe()}; the window is set by {policy.setting} "
        f"({ANY_ZONE!r} or seconds either way)",
    )


class ReplayCache:
    """Signatures seen while they could still be accepted: the same signature again is a
    replay. A signature stays acceptable for the width of the Date window from when it is
    first seen (``keep_s``; unlimited when the Date is not checked). Bounded: past
    ``max_entries`` the oldest are forgotten (a replay of those is then not caught). A client
    that sends the same body twice within one second (the Date's resolution) signs it
    identically, so its second call is refused too: the cache is off by default."""

    def __init__(self, keep_s: float, max_entries: int) -> None:
        self.keep_s = keep_s
        self.max_entries = max_entries
        self._seen: OrderedDict[str, float] = OrderedDict()  # signature -> forgotten after

    def replayed(self, signature: str, now: float | None = None, keep_s: float | None = None) -> bool:
        """True when ``signature`` was seen and is still remembered; else remember it for
        ``keep_s`` (default: the cache's)."""
        now = time.monotonic() if now is None else now
        seen = self._seen
        while seen:
            oldest, until = next(iter(seen.items()))
            if now <= until and len(seen) < self.max_entries:
                break
            del seen[oldest]  # expired, or room needed
        until = seen.get(signature)
        if until is not None and now <= until:
            return True
        seen[signature] = now + (self.keep_s if keep_s is None else keep_s)
        seen.move_to_end(signature)
        return False


def keep_for(policy: SignaturePolicy) -> float:
    """How long a signature stays acceptable after it is first seen: the window's width."""
    window = policy.window
    return math.inf if window is None else window[0] + window[1]


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


def replay_cache(gateway: GatewayConfig) -> ReplayCache | None:
    """The replay cache a ``GatewayConfig`` asks for (``signature_replay_cache`` entries), or None."""
    size = int(gateway.signature_replay_cache)
    return ReplayCache(keep_for(SignaturePolicy.of(gateway)), size) if size > 0 else None


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
    return check_date(date, policy, time.time())


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
