"""Models named by a URL: which URLs the gateway fetches, checking and showing them.

A service's ``model`` (or a ``versions:`` entry) may be a URL: ``s3://bucket/key`` (any
S3-compatible store), ``oss://bucket/key`` (Alibaba OSS through its S3-compatible API),
``https://`` or ``http://``; ``file:///path`` is a local file, read as its path. The config
only checks a URL: the gateway fetches it (gateway.sources) when the service starts.
Credentials never come from the config text: a URL with a user or password in it is refused;
they come from the environment or from a secret file that a ``gateway.model_sources`` entry
names (gateway.config.sources). A leaf beside gateway.config.files, so the value readers use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from gateway.config.files import ConfigError

# Fetched by the gateway; file:// is read as a local path by the config.
REMOTE_SCHEMES = ("s3", "oss", "https", "http")
ADDRESSING_STYLES = ("auto", "path", "virtual")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$")


@dataclass(frozen=True)
class ModelSource:
    """Settings for the model URLs that start with ``prefix`` (the longest prefix wins)."""

    prefix: str
    # An S3-compatible store's endpoint (``https://host:port``; OSS's form ``oss-cn-hangzhou.aliyuncs.com``
    # is read as https). None: the environment's (AWS_ENDPOINT_URL, OSS_ENDPOINT) or AWS's own.
    endpoint: str | None = None
    region: str | None = None
    # How the bucket is addressed: in the path or in the host name (auto: the client's choice
    # for s3://, virtual for oss://, which OSS requires).
    addressing_style: str = "auto"
    # A file of ``key = value`` lines: access_key_id, secret_access_key (session_token) for a
    # store; token (a bearer token) or username and password for http(s). None: the environment.
    credentials_file: str | None = None
    # A CA bundle to verify the store's or server's TLS certificate with (None: the system's).
    ca_file: str | None = None
    # Connect and read timeout of one request to the store, in seconds.
    timeout_s: float = 60.0


def is_model_url(value: Any) -> bool:
    """Whether a model names a URL (``scheme://``) that is not a local file: the gateway
    fetches it, and :func:`check_model_url` refuses a scheme it cannot fetch."""
    if not isinstance(value, str):
        return False
    match = _SCHEME_RE.match(value)
    return match is not None and match.group(1).lower() != "file"


def is_file_url(value: Any) -> bool:
    return isinstance(value, str) and value.lower().startswith("file://")


def file_url_path(url: str, where: str) -> str:
    """``file:///abs/path`` (or ``file://localhost/abs/path``) -> ``/abs/path``."""
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(
            f"{where}: a file:// URL names a file on this host (file:///path), not on {parts.netloc!r}"
        )
    if not parts.path:
        raise ConfigError(f"{where}: the file:// URL names no file")
    return unquote(parts.path)


def redact_url(url: str) -> str:
    """The URL as logs and errors show it: no user, password or query (a presigned URL's
    signature is there)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<a malformed URL>"
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    query = "?..." if parts.query else ""
    return f"{parts.scheme}://{host}{parts.path}{query}"


def check_model_url(url: str, where: str) -> str:
    """A remote model URL, checked: a scheme the gateway fetches, a bucket and a key (a host
    and a path for http), no credentials in it. -> the URL as given."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port raises on a bad one
    except ValueError as exc:
        raise ConfigError(f"{where}: not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    shown = redact_url(url)
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            f"{where}: {shown}: credentials do not belong in the config; put them in the environment "
            "or in a secret file named by gateway.model_sources (credentials_file)"
        )
    if scheme not in REMOTE_SCHEMES:
        raise ConfigError(f"{where}: {shown}: expected one of {', '.join(s + '://' for s in REMOTE_SCHEMES)}")
    if scheme in ("s3", "oss"):
        bucket = parts.netloc
        if not bucket or not _BUCKET_RE.match(bucket):
            raise ConfigError(f"{where}: {shown}: expected {scheme}://bucket/key with a valid bucket name")
        if not parts.path.strip("/") or parts.path.endswith("/"):
            raise ConfigError(f"{where}: {shown}: expected {scheme}://bucket/key naming one object")
        if parts.query or parts.fragment:
            raise ConfigError(f"{where}: {shown}: a {scheme}:// URL takes no query or fragment")
    elif not parts.hostname or not parts.path.strip("/"):
        raise ConfigError(f"{where}: {shown}: expected {scheme}://host/path naming one file")
    return url


def source_for(url: str, sources: tuple[ModelSource, ...]) -> ModelSource | None:
    """The settings of the longest prefix ``url`` starts with; None: none applies."""
    best: ModelSource | None = None
    for src in sources:
        if url.startswith(src.prefix) and (best is None or len(src.prefix) > len(best.prefix)):
            best = src
    return best


__all__ = [
    "ADDRESSING_STYLES",
    "REMOTE_SCHEMES",
    "ModelSource",
    "check_model_url",
    "file_url_path",
    "is_file_url",
    "is_model_url",
    "redact_url",
    "source_for",
]
