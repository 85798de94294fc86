"""The queue protocol's plain replies: text bodies and refusals (``QueueError``)."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from gateway.lean_http import Reply
from gateway.queue.records import QueueError

JSON = "application/json; charset=utf-8"
# Refusals a client should retry (full, unavailable, storage trouble) tell it when.
_RETRY_AFTER = {"Retry-After": "1"}


def to_response(reply: Reply) -> web.Response:
    headers = {"Content-Type": reply.content_type}
    if reply.headers:
        headers.update(reply.headers)
    return web.Response(status=reply.status, body=reply.body, headers=headers)


def text(status: int, body: str, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, body.encode("utf-8"), "text/plain; charset=utf-8", headers)


def error_reply(err: QueueError) -> Reply:
    return text(err.status, err.message, _RETRY_AFTER if err.status in (429, 503, 507) else None)


def error_response(err: QueueError) -> web.Response:
    return to_response(error_reply(err))
