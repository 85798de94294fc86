"""I/O-free core of the queue clients: URLs, query strings, headers, parsing.

Shared by ``eas_sdk.queue.QueueClient`` and ``eas_sdk.aio_queue.AsyncQueueClient``
(the SDK transports for HTTP, ``websockets`` for watching); the retry rules of one
call are in ``queue_call``. Query strings are built with ``urllib.parse.urlencode``
over the same keys, values and order as the reference client (so ``,`` becomes
``%2C`` and a space ``+``).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from eas_sdk._proto.queue_pb2 import DataFrameListProto, DataFrameProto
from eas_sdk.errors import BadRequestError

from . import constants as C

PROTOBUF_ACCEPT = {"Accept": C.CONTENT_TYPE_PROTOBUF}


class DataFrame:
    """One queue record: ``.index`` (int), ``.data`` (bytes), ``.tags`` (dict), ``.message`` (str)."""

    __slots__ = ("data", "index", "message", "tags")

    def __init__(
        self, index: int = 0, data: bytes = b"", tags: Mapping[str, str] | None = None, message: str = ""
    ):
        self.index = index
        self.data = data
        self.tags: dict[str, str] = dict(tags or {})
        self.message = message

    @classmethod
    def from_proto(cls, df: DataFrameProto) -> DataFrame:
        # Per record on a watch: the tags are copied once, without __init__'s second copy, key
        # by key (protobuf's map iterates its keys in C; its items() is the abc's Python view:
        # 0.56 instead of 0.74 µs for two tags).
        out = cls.__new__(cls)
        out.index = df.index
        out.data = df.data
        tags = df.tags
        out.tags = {k: tags[k] for k in tags}
        out.message = df.message
        return out

    @classmethod
    def decode(cls, raw: bytes) -> DataFrame:
        df = DataFrameProto()
        df.ParseFromString(raw)
        return cls.from_proto(df)

    # Setters of the reference wrapper.
    def set_data(self, data: bytes) -> None:
        self.data = data

    def set_index(self, index: int) -> None:
        self.index = index

    def set_message(self, message: str) -> None:
        self.message = message

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tags = tags

    @property
    def request_id(self) -> str | None:
        return self.tags.get(C.TAG_REQUEST_ID)

    def __repr__(self) -> str:
        return (
            f"DataFrame(index={self.index}, data={len(self.data)} bytes, "
            f"tags={self.tags!r}, message={self.message!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DataFrame):
            return NotImplemented
        return (self.index, self.data, self.tags, self.message) == (
            other.index,
            other.data,
            other.tags,
            other.message,
        )

    __hash__ = None  # type: ignore[assignment]


def to_pandas(frames: Iterable[DataFrame]) -> Any:
    """Records as a pandas DataFrame: columns index, data, message, tags (pandas is an optional extra)."""
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("to_pandas needs pandas: pip install 'easkit[pandas]'") from exc
    rows = [{"index": f.index, "data": f.data, "message": f.message, "tags": dict(f.tags)} for f in frames]
    return pd.DataFrame(rows, columns=["index", "data", "message", "tags"])


# ---------------------------------------------------------------------- URLs


def normalize_endpoint(endpoint: str) -> str:
    endpoint = endpoint.strip().rstrip("/")
    if endpoint and "://" not in endpoint:
        endpoint = "http://" + endpoint
    return endpoint


def base_url(endpoint: str, queue_name: str, custom_url: str = "", path_suffix: str = "") -> str:
    """``custom_url`` verbatim, else ``<endpoint>/api/predict/<queue_name>[/<path_suffix>]``."""
    if custom_url:
        return custom_url
    if not endpoint:
        raise ValueError("a queue client needs an endpoint or a custom_url")
    url = f"{normalize_endpoint(endpoint)}{C.PREDICT_PATH_PREFIX}{queue_name}"
    if path_suffix:
        url += "/" + path_suffix.strip("/")
    return url


_PLAIN = re.compile(r"[A-Za-z0-9_.~,-]*")


def _plain_qs(query: Mapping[str, Any]) -> str | None:
    """The query string when no key or value needs quoting but for commas (a list of indexes),
    exactly as urlencode would write it; else None."""
    parts = []
    for k, v in query.items():
        if type(v) is int:
            v = str(v)
        if not (type(k) is str and type(v) is str and _PLAIN.fullmatch(k) and _PLAIN.fullmatch(v)):
            return None
        parts.append(f"{k}={v}")
    return "&".join(parts).replace(",", "%2C")


def build_url(base: str, query: Mapping[str, Any], websocket: bool = False) -> str:
    url = base
    if websocket:
        url = url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        if not url.startswith(("ws://", "wss://")):
            url = "ws://" + url
    qs = _plain_qs(query)
    if qs is None:
        qs = urllib.parse.urlencode(query)
    if qs:
        # Unlike the reference client, a base URL that already has a query is extended with '&'.
        url += ("&" if "?" in base else "?") + qs
    return url


def identity_headers(
    token: str | None,
    uid: str,
    gid: str,
    content_type: str = "",
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The headers of every queue call: the raw token (like the reference), uid and gid."""
    headers = dict(extra or {})
    if content_type:
        headers[C.HEADER_CONTENT_TYPE] = content_type
    headers[C.HEADER_AUTHORIZATION] = token or ""
    headers[C.HEADER_QUEUE_UID] = uid
    headers[C.HEADER_QUEUE_GID] = gid
    return headers


# ---------------------------------------------------------------------- queries


def check_index(index: object) -> bool:
    """A positive int, or a string of digits > 0 (the reference rule for search)."""
    if isinstance(index, bool):
        return False
    if isinstance(index, int):
        return index > 0
    if isinstance(index, float):
        return index > 0 and index.is_integer()
    if isinstance(index, str):
        return index.isdigit() and index.isascii() and int(index) > 0
    return False


def index_list(indexes: object) -> list[int]:
    """One index or a list of them, each validated (a bad one raises before any request)."""
    items: Sequence[object] = indexes if isinstance(indexes, (list, tuple)) else [indexes]
    if not items:
        raise BadRequestError(400, "no index given")
    if all(type(i) is int for i in items) and min(items) > 0:  # type: ignore[type-var]
        return list(items)  # type: ignore[arg-type]  # plain positive ints, the usual call
    out: list[int] = []
    for i in items:
        if not check_index(i):
            raise BadRequestError(400, f"invalid queue index {i!r}: expected a positive integer")
        out.append(int(i))  # type: ignore[call-overload]
    return out


def check_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(tags or {})
    for k in out:
        if not isinstance(k, str) or not k or k.startswith("_"):
            raise BadRequestError(400, f"invalid tag name {k!r}: names starting with '_' are reserved")
    return out


def get_query(
    request_id: str | None,
    index: int | str,
    length: int,
    timeout: str,
    auto_delete: bool,
    tags: Mapping[str, str],
) -> dict[str, str]:
    q = {
        C.Q_INDEX: str(index),
        C.Q_LENGTH: str(length),
        C.Q_TIMEOUT: str(timeout),
        C.Q_RAW: "false",
        C.Q_AUTO_DELETE: str(bool(auto_delete)).lower(),
    }
    if request_id is not None:
        q[C.Q_REQUEST_ID] = request_id
    q.update(check_tags(tags))
    return q


def watch_query(
    index: int, window: int, index_only: bool, auto_commit: bool, tags: Mapping[str, str] | None
) -> dict[str, Any]:
    q: dict[str, Any] = {
        C.Q_WATCH: "true",
        C.Q_INDEX: index,
        C.Q_WINDOW: window,
        C.Q_INDEX_ONLY: str(bool(index_only)).lower(),
        C.Q_AUTO_COMMIT: str(bool(auto_commit)).lower(),
    }
    q.update(check_tags(tags))
    return q


def indexes_query(indexes: list[int]) -> dict[str, str]:
    return {C.Q_INDEXES: ",".join(map(str, indexes))}


def truncate_query(index: object) -> dict[str, Any]:
    if not check_index(index):
        raise BadRequestError(400, f"invalid truncate index {index!r}: expected a positive integer")
    return {C.Q_INDEX: index, C.Q_TRUNC: "true"}


ATTRS_QUERY = {C.Q_ATTRS: "true"}


def search_query(index: object) -> dict[str, str]:
    return {C.Q_SEARCH: "true", C.Q_INDEX: str(index)}


_DURATIONS: dict[str, float] = {}  # the few distinct values a program sends, parsed once


def duration_seconds(timeout: str | int | float) -> float:
    """Seconds in a Go-style duration as sent in ``_timeout_`` (best effort; 0 when unknown)."""
    if isinstance(timeout, (int, float)):
        return float(timeout)
    got = _DURATIONS.get(timeout)
    if got is None:
        got = _duration_seconds(timeout)
        if len(_DURATIONS) < 256:
            _DURATIONS[timeout] = got
    return got


def _duration_seconds(timeout: str) -> float:
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    total, num = 0.0, ""
    i, s = 0, timeout.strip()
    if s.isdigit():
        return float(s)
    while i < len(s):
        ch = s[i]
        if ch.isdigit() or ch == ".":
            num += ch
            i += 1
            continue
        for u in ("ns", "us", "µs", "ms", "s", "m", "h"):
            if s.startswith(u, i):
                try:
                    total += float(num) * units[u]
                except ValueError:
                    return 0.0
                num = ""
                i += len(u)
                break
        else:
            return 0.0
    return total


# ---------------------------------------------------------------------- responses


def parse_put(body: bytes, headers: Mapping[str, str]) -> tuple[str, str]:
    rid = headers.get(C.HEADER_QUEUE_REQUEST_ID)
    if rid is None:
        lower = C.HEADER_QUEUE_REQUEST_ID.lower()
        rid = next((v for k, v in headers.items() if k.lower() == lower), "")
    return body.decode("utf-8"), rid


def parse_get(body: bytes) -> list[DataFrame]:
    lst = DataFrameListProto()
    lst.ParseFromString(body)
    return [DataFrame.from_proto(df) for df in lst.index]


def parse_json(body: bytes) -> dict[str, Any]:
    text = body.strip().decode("utf-8", "replace")
    if not text:
        return {}
    try:
        out = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return out if isinstance(out, dict) else {}
