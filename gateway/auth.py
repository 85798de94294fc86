"""Token checks for predict, queue and worker endpoints.

Three forms, all accepted on every service that has a token:
  * ``Authorization: <token>`` (raw token; queue clients, custom_url, old clients)
  * ``Authorization: Bearer <token>`` (the same token as KServe's and Triton's clients send it)
  * ``Authorization: EAS <base64 hmac-sha1>`` (see eas_sdk._core.auth)

Compatibility rules, so that every existing EAS client is accepted: header values
are read as sent, the Date is not checked for skew (reference clients send local
time labelled GMT), a signature that fails with the sent Content-Type is retried with
``application/octet-stream`` (Java SDK), and Content-MD5 is compared as a
number (Java drops leading zeros). All comparisons are constant time on bytes.
"""

from __future__ import annotations

import base64
import binascii
import enum
import functools
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eas_sdk._core.auth import canonical_resource, content_md5, hmac_digest, string_to_sign
from eas_sdk._core.constants import DEFAULT_CONTENT_TYPE, PREDICT_PATH_PREFIX

MAX_AUTH_HEADER = 4096


class AuthStatus(enum.Enum):
    OK = "ok"
    MISSING = "missing"
    INVALID = "invalid"
    BAD_DIGEST = "bad_digest"


@dataclass(frozen=True)
class AuthResult:
    status: AuthStatus
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is AuthStatus.OK


OK = AuthResult(AuthStatus.OK)


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


def verify(
    tokens: Sequence[str],
    headers: Mapping[str, str],
    path: str,
    body: bytes | bytearray | memoryview | None,
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
            ctypes = [ctype] if ctype == DEFAULT_CONTENT_TYPE else [ctype, DEFAULT_CONTENT_TYPE]
            for token in tokens:
                for resource in resources:
                    for ct in ctypes:
                        expected = hmac_digest(token, string_to_sign("POST", md5_sent, ct, date, resource))
                        if hmac.compare_digest(expected, sent_sig):
                            if md5_sent and not _md5_equal(md5_sent, body):
                                return AuthResult(
                                    AuthStatus.BAD_DIGEST, "Content-MD5 does not match the body"
                                )
                            return OK
        # Fall through: an "EAS ..." value may still be someone's raw token.

    # "Bearer <token>" carries the raw token; a raw token that itself starts with "Bearer "
    # still matches as sent.
    candidates = [auth, auth[7:]] if auth[:7].lower() == "bearer " else [auth]
    return _raw_token_ok(tokens, candidates)


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
