"""Where a model URL's bytes come from: an S3-compatible store (boto3) or an HTTP(S) server.

Each store answers two questions: what version of the object is there now (``stat``: cheap,
so an unchanged object is taken from the cache without a download) and its bytes
(``chunks``). Credentials come from the secret file a model source names, or from the
environment (boto3's own chain for s3://, ``OSS_ACCESS_KEY_ID``/``OSS_ACCESS_KEY_SECRET``
for oss://); never from the URL.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from gateway.config.model_urls import ModelSource

CHUNK = 1024 * 1024
_NAME_RE = re.compile(r"[^A-Za-z0-9._-]")


class StoreError(Exception):
    """The store's own answer or failure, in words a user can act on (no credentials)."""


@dataclass(frozen=True)
class ObjectInfo:
    # What identifies the object's content (a version id, an ETag; None: nothing does, so it
    # is downloaded every time); its size when known; the file name to keep it under.
    version: str | None
    size: int | None
    name: str
    etag: str | None = None
    version_id: str | None = None


# A download: its bytes in chunks, and the SHA-256 (hex) the store vouches for, if any.
Chunks = tuple[Iterator[bytes], str | None]


class Store(Protocol):
    def stat(self) -> ObjectInfo: ...

    def chunks(
        self, info: ObjectInfo
    ) -> contextlib.AbstractContextManager[tuple[Iterator[bytes], str | None]]:
        """The object's bytes in chunks, and the SHA-256 (hex) the store vouches for, if any."""
        ...


def file_name(path: str) -> str:
    name = _NAME_RE.sub("_", PurePosixPath(unquote(path)).name).lstrip(".")
    return name or "model"


# --- credentials ---------------------------------------------------------------------

_ALIASES = {
    "access_key_id": ("access_key_id", "aws_access_key_id", "oss_access_key_id", "accesskeyid"),
    "secret_access_key": (
        "secret_access_key", "aws_secret_access_key", "access_key_secret", "oss_access_key_secret",
        "accesskeysecret",
    ),
    "session_token": ("session_token", "aws_session_token", "security_token", "oss_session_token"),
    "token": ("token", "bearer_token"),
    "username": ("username", "user"),
    "password": ("password",),
}  # fmt: skip


def read_credentials(path: str) -> dict[str, str]:
    """A secret file of ``key = value`` (or ``key: value``) lines; ``[section]`` headers and
    ``#`` comments are skipped, so an AWS credentials file with one profile reads as well.
    Errors name the file, never a value."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise StoreError(f"credentials file {path}: {exc.strerror or exc}") from None
    raw: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, sep, value = line.partition(":")
        if not sep:
            raise StoreError(f"credentials file {path}: expected key = value lines")
        raw[key.strip().lower().removeprefix("export ").strip()] = value.strip().strip("'\"")
    out = {}
    for canonical, names in _ALIASES.items():
        for name in names:
            if raw.get(name):
                out[canonical] = raw[name]
                break
    return out


# --- S3-compatible stores ------------------------------------------------------------

_OSS_HOST_RE = re.compile(r"^(?:s3\.)?oss-([a-z0-9-]+?)(?:-internal)?\.aliyuncs\.com$")


def _oss_endpoint(endpoint: str) -> tuple[str, str | None]:
    """OSS's endpoint form (``oss-cn-hangzhou.aliyuncs.com``) -> its S3-compatible endpoint
    (``https://s3.oss-cn-hangzhou.aliyuncs.com``) and the region that signs for it."""
    if "://" in endpoint:
        host = urlsplit(endpoint).hostname or ""
        match = _OSS_HOST_RE.match(host)
        return endpoint, match.group(1) if match else None
    host = endpoint.strip("/")
    match = _OSS_HOST_RE.match(host)
    if match is None:
        return f"https://{host}", None
    return f"https://{host if host.startswith('s3.') else 's3.' + host}", match.group(1)


def s3_client_args(scheme: str, bucket: str, src: ModelSource | None) -> tuple[str, dict[str, Any]]:
    """(bucket, keyword arguments for ``boto3.client("s3", ...)``) for an s3:// or oss:// URL.
    An oss:// URL's bucket may carry its endpoint (``oss://bucket.oss-cn-hangzhou.aliyuncs.com/key``)."""
    from botocore.config import Config

    endpoint = src.endpoint if src else None
    region = src.region if src else None
    style = src.addressing_style if src else "auto"
    creds: dict[str, str] = read_credentials(src.credentials_file) if src and src.credentials_file else {}
    if scheme == "oss":
        if ".aliyuncs.com" in bucket:
            bucket, _, host = bucket.partition(".")
            endpoint = endpoint or host
        endpoint = endpoint or os.environ.get("OSS_ENDPOINT")
        if not endpoint:
            raise StoreError(
                "no OSS endpoint: give one in the model source (endpoint: oss-cn-hangzhou.aliyuncs.com), "
                "in the URL (oss://bucket.oss-cn-hangzhou.aliyuncs.com/key) or in OSS_ENDPOINT"
            )
        endpoint, oss_region = _oss_endpoint(endpoint)
        region = region or oss_region or "us-east-1"
        style = "virtual" if style == "auto" else style  # OSS serves buckets by host name
        if not creds and os.environ.get("OSS_ACCESS_KEY_ID"):
            creds = {
                "access_key_id": os.environ["OSS_ACCESS_KEY_ID"],
                "secret_access_key": os.environ.get("OSS_ACCESS_KEY_SECRET", ""),
                "session_token": os.environ.get("OSS_SESSION_TOKEN", ""),
            }
    timeout = src.timeout_s if src else 60.0
    kwargs: dict[str, Any] = {
        "config": Config(
            connect_timeout=timeout,
            read_timeout=timeout,
            retries={"max_attempts": 3, "mode": "standard"},
            s3={"addressing_style": style},
            signature_version="s3v4",
            # Integrity is the gateway's own SHA-256; a store that computes no checksums
            # (older S3-compatible servers, OSS) must not be asked for them.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
    }
    if endpoint:
        kwargs["endpoint_url"] = endpoint if "://" in endpoint else f"https://{endpoint}"
    if region:
        kwargs["region_name"] = region
    if src and src.ca_file:
        kwargs["verify"] = src.ca_file
    if creds:
        if not creds.get("access_key_id") or not creds.get("secret_access_key"):
            raise StoreError("the credentials file needs access_key_id and secret_access_key")
        kwargs["aws_access_key_id"] = creds["access_key_id"]
        kwargs["aws_secret_access_key"] = creds["secret_access_key"]
        if creds.get("session_token"):
            kwargs["aws_session_token"] = creds["session_token"]
    return bucket, kwargs


def _client_error(exc: Exception) -> StoreError:
    """botocore's failures as the store's words: its error code and message, or the transport's."""
    from botocore.exceptions import ClientError, NoCredentialsError

    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = err.get("Code") or status or "error"
        message = err.get("Message") or {403: "access denied", 404: "no such object"}.get(status or 0, "")
        return StoreError(f"{code}: {message}" if message else str(code))
    if isinstance(exc, NoCredentialsError):
        return StoreError(
            "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (OSS_ACCESS_KEY_ID and "
            "OSS_ACCESS_KEY_SECRET for oss://) or name a credentials_file in the model source"
        )
    return StoreError(str(exc) or type(exc).__name__)


class S3Object:
    """One object of an S3-compatible store (AWS S3, MinIO, Alibaba OSS, ...)."""

    def __init__(self, url: str, src: ModelSource | None) -> None:
        try:
            import boto3
        except ImportError:
            raise StoreError("s3:// and oss:// models need boto3: pip install 'easkit[s3]'") from None
        parts = urlsplit(url)
        self.key = unquote(parts.path.lstrip("/"))
        self.bucket, kwargs = s3_client_args(parts.scheme.lower(), parts.netloc, src)
        try:
            self.client = boto3.session.Session().client("s3", **kwargs)
        except Exception as exc:
            raise _client_error(exc) from None

    def stat(self) -> ObjectInfo:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            try:
                # A one-byte read, not HEAD: a refusal then carries the store's error code
                # and message (a HEAD answer has no body to carry them).
                r = self.client.get_object(Bucket=self.bucket, Key=self.key, Range="bytes=0-0")
                r["Body"].close()
                size = int(str(r.get("ContentRange", "")).rpartition("/")[2] or r["ContentLength"])
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "InvalidRange":
                    raise
                r = self.client.head_object(Bucket=self.bucket, Key=self.key)  # an empty object
                size = int(r["ContentLength"])
        except (ClientError, BotoCoreError, ValueError) as exc:
            raise _client_error(exc) from None
        etag = r.get("ETag")
        version_id = r.get("VersionId")
        if version_id == "null":
            version_id = None
        version = f"v:{version_id}" if version_id else (f"e:{etag}:{size}" if etag else None)
        return ObjectInfo(version, size, file_name(self.key), etag, version_id)

    @contextlib.contextmanager
    def chunks(self, info: ObjectInfo) -> Iterator[Chunks]:
        from botocore.exceptions import BotoCoreError, ClientError

        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self.key, "ChecksumMode": "ENABLED"}
        if info.version_id:
            args["VersionId"] = info.version_id
        elif info.etag:
            args["IfMatch"] = info.etag  # the version found by stat, not one written since
        try:
            r = self.client.get_object(**args)
        except (ClientError, BotoCoreError) as exc:
            raise _client_error(exc) from None
        body = r["Body"]
        expected = None
        checksum = r.get("ChecksumSHA256")
        if checksum and "-" not in checksum and r.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
            expected = base64.b64decode(checksum).hex()

        def read() -> Iterator[bytes]:
            try:
                yield from body.iter_chunks(CHUNK)
            except (BotoCoreError, OSError) as exc:
                raise _client_error(exc) from None

        try:
            yield read(), expected
        finally:
            body.close()


def list_objects(url: str, src: ModelSource | None) -> list[tuple[str, str, int]]:
    """(key below the URL's prefix, ETag, size) of every object under an s3:// or oss://
    prefix (``s3://bucket/models/``): a model repository in a bucket."""
    from botocore.exceptions import BotoCoreError, ClientError

    parts = urlsplit(url)
    obj = S3Object(f"{parts.scheme}://{parts.netloc}/", src)  # the bucket's client
    prefix = unquote(parts.path.lstrip("/"))
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    out: list[tuple[str, str, int]] = []
    try:
        for page in obj.client.get_paginator("list_objects_v2").paginate(Bucket=obj.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                out.append((item["Key"][len(prefix) :], str(item.get("ETag", "")), int(item.get("Size", 0))))
    except (ClientError, BotoCoreError) as exc:
        raise _client_error(exc) from None
    return out


# --- HTTP(S) servers -----------------------------------------------------------------


class HttpObject:
    """A file on an HTTP(S) server; a bearer token or a user and password from a secret file."""

    def __init__(self, url: str, src: ModelSource | None) -> None:
        self.url = url
        self.timeout = src.timeout_s if src else 60.0
        self.context = ssl.create_default_context(cafile=src.ca_file if src and src.ca_file else None)
        self.auth: str | None = None
        creds = read_credentials(src.credentials_file) if src and src.credentials_file else {}
        if creds.get("token"):
            self.auth = f"Bearer {creds['token']}"
        elif creds.get("username"):
            pair = f"{creds['username']}:{creds.get('password', '')}".encode()
            self.auth = f"Basic {base64.b64encode(pair).decode()}"
        self.name = file_name(urlsplit(url).path)

    def _open(self, method: str, headers: dict[str, str] | None = None) -> Any:
        req = urllib.request.Request(self.url, method=method, headers=headers or {})  # noqa: S310
        if self.auth:
            # Unredirected: a redirect to another host does not carry the credentials there.
            req.add_unredirected_header("Authorization", self.auth)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout, context=self.context)  # noqa: S310
        except urllib.error.HTTPError as exc:
            exc.close()
            raise StoreError(f"HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            raise StoreError(str(exc.reason)) from None
        except (OSError, ValueError) as exc:
            raise StoreError(str(exc) or type(exc).__name__) from None

    def stat(self) -> ObjectInfo:
        # The first byte, not HEAD: a presigned URL is signed for GET only. A server that
        # ignores the range answers the whole file, of which nothing is read here.
        try:
            with self._open("GET", {"Range": "bytes=0-0"}) as r:
                headers = r.headers
                status = r.status
        except StoreError as exc:
            if not str(exc).startswith("HTTP 416"):  # an empty file has no first byte
                raise
            with self._open("HEAD") as r:
                headers, status = r.headers, r.status
        length = headers.get("Content-Length")
        size = int(length) if length and length.isdigit() else None
        total = str(headers.get("Content-Range", "")).rpartition("/")[2]
        if status == 206:
            size = int(total) if total.isdigit() else None
        etag = headers.get("ETag")
        modified = headers.get("Last-Modified")
        if etag and not etag.startswith("W/"):
            version: str | None = f"e:{etag}:{size}"
        elif modified and size is not None:
            version = f"m:{modified}:{size}"
        else:
            version = None
        return ObjectInfo(version, size, self.name, etag)

    @contextlib.contextmanager
    def chunks(self, info: ObjectInfo) -> Iterator[Chunks]:
        r = self._open("GET")

        def read() -> Iterator[bytes]:
            try:
                while chunk := r.read1(CHUNK):  # what has come, so progress moves
                    yield chunk
            except OSError as exc:
                raise StoreError(str(exc) or type(exc).__name__) from None

        try:
            yield read(), None
        finally:
            r.close()


def open_store(url: str, src: ModelSource | None) -> Store:
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("s3", "oss"):
        return S3Object(url, src)
    return HttpObject(url, src)


__all__ = [
    "HttpObject",
    "ObjectInfo",
    "S3Object",
    "Store",
    "StoreError",
    "file_name",
    "list_objects",
    "open_store",
    "read_credentials",
    "s3_client_args",
]
