"""The admin API's queue routes: a service's consumer groups, listed and deleted.

* ``GET /admin/services/{name}/groups``: every group of each of the service's queues
  (a queue service has one queue, an asynchronous service its input and ``<name>/sink``);
* ``DELETE /admin/services/{name}/groups/{group}?queue=<queue>``: forget a group and delete
  the records only it still needed (``queue`` defaults to the service's own queue; ``sink``
  names the sink). A group with a connected consumer is refused (409).

The rules (and the automatic deletion of idle groups) are in ``gateway.queue.retention``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.config import SERVICE_NAME_RE
from gateway.core import errors
from gateway.fronts.state import GATEWAY_KEY
from gateway.queue.backend import StorageError
from gateway.queue.groups_admin import delete_group, list_groups
from gateway.queue.records import QueueError
from gateway.queue.store import Queue


class StorageUnavailable(errors.GatewayError):
    """The queue store refused the write (disk full, read-only, Redis refusing writes)."""

    status, code = 507, "InsufficientStorage"


def _queues(request: web.Request) -> tuple[str, dict[str, Queue | None]]:
    """The service's queue names -> the queue when this gateway serves it."""
    name = request.match_info["name"]
    if not SERVICE_NAME_RE.fullmatch(name):
        raise errors.InvalidServiceName("invalid service name")
    qm = request.app[GATEWAY_KEY].queues
    names = [] if qm is None else [n for n in qm.configs if n == name or n.startswith(name + "/")]
    if not names:
        raise errors.ServiceNotFound(f"service {name!r} has no queue")
    return name, {n: qm.queues.get(n) for n in names}


def _served(qname: str, q: Queue | None) -> Queue:
    if q is None:  # a Redis store whose lease another gateway holds
        raise errors.ServiceNotReady(f"queue {qname} is served by another gateway: ask that one")
    return q


def _json(doc: Any) -> web.Response:
    return web.Response(text=json.dumps(doc), content_type="application/json")


def _gateway_error(err: QueueError) -> errors.GatewayError:
    if err.status == 404:
        return errors.NotFound(err.message)
    if err.status == 409:
        return errors.Conflict(err.message)
    if err.status == 507:
        return StorageUnavailable(err.message)
    return errors.BadRequest(err.message)


async def get_groups(request: web.Request) -> web.Response:
    name, queues = _queues(request)
    return _json({"service": name, "queues": {n: list_groups(_served(n, q)) for n, q in queues.items()}})


async def remove_group(request: web.Request) -> web.Response:
    name, queues = _queues(request)
    which = request.query.get("queue", name)
    qname = f"{name}/{which}" if which != name and "/" not in which else which
    if qname not in queues:
        have = ", ".join(queues)
        raise errors.BadRequest(f"queue: service {name!r} has no queue {which!r} (it has {have})")
    q = _served(qname, queues[qname])
    gid = request.match_info["group"]
    try:
        released, dur = delete_group(q, gid)
        if dur is not None:
            await dur
    except QueueError as err:
        raise _gateway_error(err) from None
    except StorageError as exc:
        raise StorageUnavailable(f"queue storage unavailable: {exc}") from None
    return _json({"deleted": gid, "queue": qname, "records_deleted": released})


def add_routes(app: web.Application, no_body: Callable[[Handler], Handler]) -> None:
    """The routes, each wrapped in ``no_body`` (neither call takes a body)."""
    app.router.add_get("/admin/services/{name}/groups", no_body(get_groups))
    app.router.add_delete("/admin/services/{name}/groups/{group}", no_body(remove_group))


__all__ = ["StorageUnavailable", "add_routes"]
