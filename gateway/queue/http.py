"""The EAS queue HTTP protocol for one queue (wire fact sheet section 5).

Dispatch by method and query: POST put; GET get / ``_attrs_`` / ``_search_`` /
``_count_``; PUT commit; DELETE delete or ``_trunc_``; a GET with ``_watch_`` and
an Upgrade header goes to ws.py. Every refusal is a 4xx whose text names the
parameter, e.g. ``400 _index_: expected an unsigned integer, got 'abc'``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from multidict import MultiMapping

from eas_sdk._core import constants as C
from eas_sdk._proto.queue_pb2 import AttributesProto, DataFrameListProto
from gateway.lean_http import Reply

from .sqlite import StorageError
from .store import MAX_GET_LENGTH, Queue, QueueError

if TYPE_CHECKING:
    from .manager import QueueManager

U64_MAX = (1 << 64) - 1
MAX_INDEXES = 10_000
MAX_TIMEOUT_S = 60.0
HEADER_NAMES = {"user": C.HEADER_QUEUE_UID, "group": C.HEADER_QUEUE_GID, "priority": C.HEADER_QUEUE_PRIORITY}

# Query keys each operation understands; any other key starting with "_" is refused.
_GET_KEYS = {C.Q_INDEX, C.Q_LENGTH, C.Q_TIMEOUT, C.Q_RAW, C.Q_AUTO_DELETE}
_GET_RID_KEYS = frozenset(_GET_KEYS | {C.Q_REQUEST_ID})
_NO_KEYS: frozenset[str] = frozenset()
_WATCH_KEYS = {C.Q_WATCH, C.Q_INDEX, C.Q_WINDOW, C.Q_INDEX_ONLY, C.Q_AUTO_COMMIT}
_UINT_RE = re.compile(r"[0-9]{1,20}")
_DURATION_RE = re.compile(r"(?:([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def bad(param: str | None, message: str, status: int = 400) -> QueueError:
    return QueueError(status, f"{param}: {message}" if param else message, param)


# ---------------------------------------------------------------------- parsing


def parse_uint(value: str, param: str, lo: int = 0, hi: int = U64_MAX) -> int:
    if not _UINT_RE.fullmatch(value):
        raise bad(param, f"expected an unsigned integer, got {value[:40]!r}")
    n = int(value)
    if n < lo or n > hi:
        raise bad(param, f"must be between {lo} and {hi}, got {value[:40]}")
    return n


def parse_indexes(value: str | None, param: str = C.Q_INDEXES) -> list[int]:
    if value is None or value == "":
        raise bad(param, "missing (a comma-separated list of indexes)")
    parts = value.split(",")
    if len(parts) > MAX_INDEXES:
        raise bad(param, f"at most {MAX_INDEXES} indexes per call, got {len(parts)}")
    return [parse_uint(p, param, lo=1) for p in parts]


def parse_bool(value: str | None, param: str, default: bool) -> bool:
    if value is None:
        return default
    v = value.lower()
    if v in ("true", "1"):
        return True
    if v in ("false", "0", ""):
        return False
    raise bad(param, f"expected true or false, got {value[:40]!r}")


_DURATIONS: dict[str, float] = {}  # the few distinct values clients send, parsed once


def parse_duration(value: str | None, param: str = C.Q_TIMEOUT, default: float = 0.0) -> float:
    """Go duration (``5s``, ``500ms``, ``1m30s``; a bare ``0`` or integer means seconds), capped at 60 s."""
    if value is None:
        return default
    secs = _DURATIONS.get(value)
    if secs is None:
        secs = _parse_duration(value, param)
        if len(_DURATIONS) < 256:
            _DURATIONS[value] = secs
    return secs


def _parse_duration(value: str, param: str) -> float:
    v = value.strip()
    if _UINT_RE.fullmatch(v):
        secs = float(int(v))
    elif _DURATION_RE.fullmatch(v):
        secs = sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(v))
    else:
        raise bad(param, f"expected a duration such as 5s or 500ms, got {value[:40]!r}")
    return min(secs, MAX_TIMEOUT_S)


def query_dict(query: MultiMapping[str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, val in query.items() if isinstance(query, MultiMapping) else query:
        if key in out:
            raise bad(key, "given more than once")
        out[key] = val
    return out


def split_tags(q: Mapping[str, str], known: AbstractSet[str]) -> dict[str, str]:
    """Tags are the query keys an operation does not use; names starting with '_' are reserved."""
    tags: dict[str, str] = {}
    for key, val in q.items():
        if key in known:
            continue
        if key.startswith("_"):
            raise bad(key, "tag names starting with '_' are reserved")
        if not key:
            raise bad("tags", "empty tag name")
        tags[key] = val
    return tags


class RequestLike(Protocol):
    """What the handlers read from a request: an aiohttp ``web.Request`` or the fast path's."""

    @property
    def method(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...  # case-insensitive
    @property
    def content_length(self) -> int | None: ...
    async def read(self) -> bytes: ...


def to_response(reply: Reply) -> web.Response:
    headers = {"Content-Type": reply.content_type}
    if reply.headers:
        headers.update(reply.headers)
    return web.Response(status=reply.status, body=reply.body, headers=headers)


def identity(request: RequestLike) -> tuple[str, str]:
    uid = request.headers.get(C.HEADER_QUEUE_UID) or str(uuid.uuid4())
    gid = request.headers.get(C.HEADER_QUEUE_GID) or C.DEFAULT_QUEUE_GROUP
    if len(uid) > 256:
        raise bad(C.HEADER_QUEUE_UID, "longer than 256 characters")
    if len(gid) > 256:
        raise bad(C.HEADER_QUEUE_GID, "longer than 256 characters")
    return uid, gid


def text(status: int, body: str, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, body.encode("utf-8"), "text/plain; charset=utf-8", headers)


_RETRY_AFTER = {"Retry-After": "1"}
_OK = Reply(200, b"OK")
JSON = "application/json; charset=utf-8"


def error_reply(err: QueueError) -> Reply:
    return text(err.status, err.message, _RETRY_AFTER if err.status in (429, 503, 507) else None)


def error_response(err: QueueError) -> web.Response:
    return to_response(error_reply(err))


# ---------------------------------------------------------------------- handlers


async def handle_http(mgr: QueueManager, q: Queue, request: web.Request) -> web.StreamResponse:
    return to_response(await dispatch(mgr, q, request, request.rel_url.query))


async def dispatch(
    mgr: QueueManager,
    q: Queue,
    request: RequestLike,
    raw_query: MultiMapping[str] | Iterable[tuple[str, str]],
) -> Reply:
    """One plain (non-WebSocket) queue call; every refusal becomes its 4xx/5xx reply."""
    try:
        query = query_dict(raw_query)
        method = request.method
        if method == "POST":
            return await _put(mgr, q, request, query)
        if method == "GET":
            if C.Q_WATCH in query:
                raise bad(C.Q_WATCH, "a watch needs a WebSocket upgrade")
            if parse_bool(query.get(C.Q_ATTRS), C.Q_ATTRS, False):
                return _attributes(mgr, q, request)
            if parse_bool(query.get(C.Q_SEARCH), C.Q_SEARCH, False):
                return _search(q, request, query)
            if parse_bool(query.get(C.Q_COUNT), C.Q_COUNT, False):
                return text(200, str(q.length))
            return await _get(mgr, q, request, query)
        if method == "PUT":
            return await _commit(q, request, query)
        if method == "DELETE":
            if parse_bool(query.get(C.Q_TRUNC), C.Q_TRUNC, False):
                below = parse_uint(query.get(C.Q_INDEX, ""), C.Q_INDEX, lo=1)
                _, dur = q.truncate(below)
                await _durable(dur)
                return _OK
            dur = q.delete(parse_indexes(query.get(C.Q_INDEXES)))
            await _durable(dur)
            return _OK
        return text(405, f"method {method} is not supported on a queue", {"Allow": "GET, POST, PUT, DELETE"})
    except QueueError as err:
        return error_reply(err)


async def _durable(dur: Any) -> None:
    if dur is None:
        return
    try:
        await dur
    except StorageError as exc:
        raise QueueError(507, f"queue storage unavailable: {exc}") from None


async def _put(mgr: QueueManager, q: Queue, request: RequestLike, query: dict[str, str]) -> Reply:
    if C.Q_PRIORITY in query or request.headers.get(C.HEADER_QUEUE_PRIORITY):
        raise bad(C.Q_PRIORITY, "priority records are not supported by this queue")
    tags = split_tags(query, _NO_KEYS)
    clen = request.content_length
    if clen is not None and clen > q.cfg.max_payload_bytes:
        raise bad(None, f"record of {clen} bytes exceeds maxPayloadBytes {q.cfg.max_payload_bytes}", 413)
    data = await request.read()
    rid = tags.pop(C.TAG_REQUEST_ID, None) or request.headers.get(C.HEADER_REQUEST_ID) or None
    if rid is not None and len(rid) > 256:
        raise bad(C.TAG_REQUEST_ID, "longer than 256 characters")
    idx, rid, dur = q.put(data, tags, rid)
    await _durable(dur)
    return Reply(200, str(idx).encode(), "text/plain; charset=utf-8", {C.HEADER_QUEUE_REQUEST_ID: rid})


async def _get(mgr: QueueManager, q: Queue, request: RequestLike, query: dict[str, str]) -> Reply:
    index = parse_uint(query.get(C.Q_INDEX, "0"), C.Q_INDEX)
    length = parse_uint(query.get(C.Q_LENGTH, "1"), C.Q_LENGTH, lo=1, hi=MAX_GET_LENGTH)
    timeout = parse_duration(query.get(C.Q_TIMEOUT), C.Q_TIMEOUT, 0.0)
    if parse_bool(query.get(C.Q_RAW), C.Q_RAW, False):
        raise bad(C.Q_RAW, "raw output is not supported; send _raw_=false")
    auto_delete = parse_bool(query.get(C.Q_AUTO_DELETE), C.Q_AUTO_DELETE, True)
    rid = query.get(C.Q_REQUEST_ID)
    tags = split_tags(query, _GET_RID_KEYS)
    # Answer a little before the client's own read timeout (which defaults to the same 5 s).
    deadline = time.monotonic() + max(0.0, timeout - min(0.25, timeout * 0.05))
    while True:
        recs, dur = q.get(index, length, auto_delete, rid, tags)
        if recs:
            await _durable(dur)
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0 or mgr.closing:
            break
        await mgr.wait_visible(q.name, remaining)
    out = DataFrameListProto()
    for r in recs:
        df = out.index.add()
        df.index = r.idx
        df.data = r.data
        df.tags.update(r.tags)
    return Reply(200, out.SerializeToString(), C.CONTENT_TYPE_PROTOBUF)


def _attributes(mgr: QueueManager, q: Queue, request: RequestLike) -> Reply:
    attrs = q.attributes(HEADER_NAMES, mgr.backend_name)
    if C.CONTENT_TYPE_PROTOBUF in request.headers.get("Accept", ""):
        msg = AttributesProto()
        msg.attributes.update(attrs)
        return Reply(200, msg.SerializeToString(), C.CONTENT_TYPE_PROTOBUF)
    return Reply(200, json.dumps(attrs).encode(), JSON)


def _search(q: Queue, request: RequestLike, query: dict[str, str]) -> Reply:
    idx = parse_uint(query.get(C.Q_INDEX, ""), C.Q_INDEX, lo=1)
    _, gid = identity(request)
    found = q.search(gid, idx)
    if found is None:
        return Reply(404, json.dumps({"error": f"index {idx} is not in the queue"}).encode(), JSON)
    return Reply(200, json.dumps(found).encode(), JSON)


async def _commit(q: Queue, request: RequestLike, query: dict[str, str]) -> Reply:
    for key in query:
        if key != C.Q_INDEXES:
            raise bad(key, "not understood by commit (only _indexes_)")
    idxs = parse_indexes(query.get(C.Q_INDEXES))
    _, gid = identity(request)
    await _durable(q.commit(gid, idxs))
    return _OK


async def wait_for(fut: asyncio.Future[None], timeout: float) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(fut), timeout)
    except TimeoutError:
        pass
