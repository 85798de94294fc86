"""PAI-EAS request signing: the legacy ``Authorization: EAS <hmac>`` scheme.

The string to sign is ``POST\\n<Content-MD5>\\n<Content-Type>\\n<Date>\\n<resource>``
(stripped), signed with HMAC-SHA1 keyed by the UTF-8 token, base64 encoded.
Content-MD5 is the lowercase hex MD5 of the body. The resource is always
``/api/predict/<service_name>`` without a query string, in every endpoint mode.
Both the SDK (signing) and the gateway (verification) use these functions.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from binascii import b2a_base64
from email.utils import formatdate

from .constants import DEFAULT_CONTENT_TYPE, HMAC_SCHEME, PREDICT_PATH_PREFIX


def content_md5(body: bytes | bytearray | memoryview) -> str:
    return hashlib.md5(body, usedforsecurity=False).hexdigest()


# (whole second, its HTTP date): the Date header only has second resolution, so a
# busy client formats it once a second instead of on every call (~6 us each).
_date_cache: tuple[int, str] = (-1, "")


def http_date(timestamp: float | None = None) -> str:
    """RFC 7231 date in real GMT (the reference client labels local time as GMT)."""
    if timestamp is not None:
        return formatdate(timestamp, usegmt=True)
    global _date_cache
    second = int(time.time())
    cached = _date_cache  # one tuple read: safe without a lock across threads
    if cached[0] == second:
        return cached[1]
    text = formatdate(second, usegmt=True)
    _date_cache = (second, text)
    return text


def canonical_resource(service_name: str) -> str:
    return PREDICT_PATH_PREFIX + service_name


def string_to_sign(method: str, md5_hex: str, content_type: str, date: str, resource: str) -> str:
    return "\n".join((method, md5_hex, content_type, date, resource)).strip()


def hmac_digest(token: str | bytes, message: str) -> bytes:
    key = token.encode("utf-8") if isinstance(token, str) else token
    return hmac.new(key, message.encode("utf-8"), hashlib.sha1).digest()


def signature(token: str | bytes, message: str) -> str:
    return base64.b64encode(hmac_digest(token, message)).decode("ascii")


_SCHEME_PREFIX = HMAC_SCHEME + " "


def eas_authorization(key: bytes, md5_hex: str, content_type: str, date: str, resource: str) -> str:
    """``Authorization`` value of the HMAC scheme for a POST (``key``: the UTF-8 token).

    The same string as ``HMAC_SCHEME + " " + signature(token, string_to_sign("POST", ...))``
    in one-shot C calls (the per-call path of the predict clients).
    """
    message = f"POST\n{md5_hex}\n{content_type}\n{date}\n{resource}".strip()
    digest = hmac.digest(key, message.encode("utf-8"), "sha1")
    return _SCHEME_PREFIX + b2a_base64(digest, newline=False).decode("ascii")


def signed_headers(
    token: str,
    body: bytes | bytearray | memoryview,
    service_name: str,
    content_type: str | None = None,
    date: str | None = None,
) -> dict[str, str]:
    """Headers for one signed attempt: Content-MD5, Content-Type, Date, Authorization."""
    ctype = content_type or DEFAULT_CONTENT_TYPE
    md5_hex = content_md5(body)
    when = date if date is not None else http_date()
    key = token.encode("utf-8")
    return {
        "Content-MD5": md5_hex,
        "Content-Type": ctype,
        "Date": when,
        "Authorization": eas_authorization(key, md5_hex, ctype, when, canonical_resource(service_name)),
    }


def plain_headers(token: str, content_type: str | None = None, date: str | None = None) -> dict[str, str]:
    """Headers of the raw-token scheme (custom_url mode, queue calls)."""
    return {
        "Content-Type": content_type or DEFAULT_CONTENT_TYPE,
        "Date": date if date is not None else http_date(),
        "Authorization": token,
    }
