"""The EAS queue HTTP protocol for one queue (as the ``eas-prediction`` 0.36 client speaks it).

Dispatch by method and query: POST put; GET get / ``_attrs_`` / ``_search_`` /
``_count_``; PUT commit; DELETE delete or ``_trunc_``; a GET with ``_watch_`` and
an Upgrade header goes to ws.py. Every refusal is a 4xx whose text names the
parameter, e.g. ``400 _index_: expected an unsigned integer, got 'abc'``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from eas_sdk._core import constants as C
from eas_sdk._proto.queue_pb2 import AttributesProto, DataFrameListProto
from gateway.lean_http import Reply
from gateway.queue.backend import StorageError
from gateway.queue.interfaces import QueueHost, RequestLike
from gateway.queue.params import (
    bad,
    identity,
    parse_bool,
    parse_duration,
    parse_indexes,
    parse_uint,
    query_dict,
    split_tags,
)
from gateway.queue.records import MAX_GET_LENGTH, QueueError
from gateway.queue.replies import JSON, error_reply, text, to_response
from gateway.queue.store import Queue

HEADER_NAMES = {"user": C.HEADER_QUEUE_UID, "group": C.HEADER_QUEUE_GID, "priority": C.HEADER_QUEUE_PRIORITY}

# Query keys each operation understands; any other key starting with "_" is refused.
_GET_KEYS = {C.Q_INDEX, C.Q_LENGTH, C.Q_TIMEOUT, C.Q_RAW, C.Q_AUTO_DELETE}
_GET_RID_KEYS = frozenset(_GET_KEYS | {C.Q_REQUEST_ID})
_NO_KEYS: frozenset[str] = frozenset()
_OK = Reply(200, b"OK")


# ---------------------------------------------------------------------- handlers


async def handle_http(mgr: QueueHost, q: Queue, request: web.Request) -> web.StreamResponse:
    return to_response(await dispatch(mgr, q, request, request.rel_url.query))


async def dispatch(
    mgr: QueueHost,
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


async def _put(mgr: QueueHost, q: Queue, request: RequestLike, query: dict[str, str]) -> Reply:
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


async def _get(mgr: QueueHost, q: Queue, request: RequestLike, query: dict[str, str]) -> Reply:
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
        try:
            recs, dur = q.get(index, length, auto_delete, rid, tags)
        except StorageError as exc:  # a payload could not be read back from disk
            raise QueueError(507, f"queue storage unavailable: {exc}") from None
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
        df.data = r.data or b""  # q.get hands records out with their payloads read
        df.tags.update(r.tags)
    return Reply(200, out.SerializeToString(), C.CONTENT_TYPE_PROTOBUF)


def _attributes(mgr: QueueHost, q: Queue, request: RequestLike) -> Reply:
    attrs = q.attributes(HEADER_NAMES, q.backend.name)
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
        raise QueueError(404, f"index {idx} is not in the queue")
    return Reply(200, json.dumps(found).encode(), JSON)


async def _commit(q: Queue, request: RequestLike, query: dict[str, str]) -> Reply:
    for key in query:
        if key != C.Q_INDEXES:
            raise bad(key, "not understood by commit (only _indexes_)")
    idxs = parse_indexes(query.get(C.Q_INDEXES))
    _, gid = identity(request)
    await _durable(q.commit(gid, idxs))
    return _OK
