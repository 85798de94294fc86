"""The queue protocol's plain replies: text bodies and refusals (``QueueError``, rendered
in the queue's text shape by gateway/codecs/errors.py)."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from gateway.codecs.errors import Shape, render
from gateway.core.errors import of_status
from gateway.lean_http import Reply
from gateway.queue.records import QueueError

JSON = "application/json; charset=utf-8"


def to_response(reply: Reply) -> web.Response:
    headers = {"Content-Type": reply.content_type}
    if reply.headers:
        headers.update(reply.headers)
    return web.Response(status=reply.status, body=reply.body, headers=headers)


def text(status: int, body: str, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, body.encode("utf-8"), "text/plain; charset=utf-8", headers)


def error_reply(err: QueueError) -> Reply:
    answer = render(of_status(err.status, err.message), Shape.QUEUE)
    return Reply(answer.status, answer.body, answer.content_type, answer.headers or None)


def error_response(err: QueueError) -> web.Response:
    return to_response(error_reply(err))
