"""QueueClient: the EAS queue service (put, get, watch, commit); the asyncio twin is in
``eas_sdk.aio_queue``, the watchers in ``eas_sdk.watcher``.

Drop-in for ``eas_prediction.QueueClient`` (0.36) with these deliberate differences:

* HTTP calls go through the SDK transports (``eas_sdk._transports``) and follow the
  SDK retry rules (``eas_sdk._core.queue_call``): transport errors,
  450/5xx and 429-with-Retry-After are retried with jittered back-off; **a 4xx is
  never retried** (the reference retried even 404 six times). Failures raise the
  ``eas_sdk.errors`` subclasses of ``PredictException``.
* ``put`` sends an ``X-Request-Id``, so a put retried after a lost response is
  stored once and returns the same index.
* ``get(auto_delete=True)`` is retried only when connecting failed: once it may
  have reached the server (read timeout, dropped or cut-off response) a retry
  could lose the records the server deleted, so the error is raised.
* One running watcher per client (sync and async), as in the reference; closing it
  lets the next one start at once. A frame that does not decode is a broken stream
  (reconnect), never an exception out of ``run()``.
* ``get`` waits for the server's long-poll: its read timeout is the client timeout
  or the ``timeout`` argument plus one second, whichever is longer.
* A TLS verification failure is final, never retried (as for predict calls).
* The watcher uses the ``websockets`` library, pings every 2 s, notices a dead
  connection within ``ping_interval + ping_timeout``, and reconnects with jittered
  back-off (at most 2 s) while it is not closed. Records delivered but not
  committed before a drop come back (the server's consumer group keeps them);
  committed records never do. A 4xx at the handshake (bad token, bad window) is
  raised instead of retried forever.
* ``close()`` sends a close frame; the reference aborted the TCP connection.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from ._core import constants as C
from ._core import queue as core
from ._core.queue import DataFrame, to_pandas
from ._queue_base import WatchSlot, _Base, failure_step
from ._transports import BaseTransport, HTTPTransport, Response, TransportFailure
from .aio_queue import AsyncQueueClient
from .errors import PredictException
from .watcher import AsyncWatcher, Watcher

__all__ = ["AsyncQueueClient", "AsyncWatcher", "DataFrame", "QueueClient", "Watcher", "to_pandas"]


class QueueClient(_Base):
    """Blocking queue client (thread-safe; one watcher at a time per client)."""

    def __init__(self, endpoint: str = "", queue_name: str = "", custom_url: str = "", **kwargs: Any) -> None:
        super().__init__(endpoint, queue_name, custom_url)
        self.max_connections = int(kwargs.get("max_connections", 10))
        self._http: BaseTransport | None = None
        self._given: BaseTransport | None = kwargs.get("transport")  # e.g. a MockTransport in tests
        self.ca_certs: str | None = kwargs.get("ca_certs")  # a PEM bundle trusted instead of the system's
        self.client_cert: str | tuple[str, str] | None = kwargs.get("client_cert")  # for mTLS
        self.watch_lock = threading.Lock()  # the reference client's name for the watcher lock
        self._watch_slot: WatchSlot[Watcher] = WatchSlot(self.watch_lock)
        self._fixed: dict[tuple[Any, ...], dict[str, str]] = {}

    @property
    def max_connection_count(self) -> int:
        """Pooled keep-alive connections (``max_connections``); takes effect at ``init()``."""
        return self.max_connections

    @max_connection_count.setter
    def max_connection_count(self, value: int) -> None:
        self.max_connections = int(value)

    def _fixed_headers(self, accept_protobuf: bool) -> dict[str, str]:
        """The headers of every call, built once per distinct setting (they are re-read each call)."""
        key = (
            self.token,
            self.uid,
            self.gid,
            self.content_type,
            accept_protobuf,
            *self.extra_headers.items(),
        )
        got = self._fixed.get(key)
        if got is None:
            if len(self._fixed) > 8:
                self._fixed.clear()
            got = self._fixed[key] = self._headers(accept_protobuf)
        return got

    def init(
        self,
        uid: str | None = None,
        gid: str = C.DEFAULT_QUEUE_GROUP,
        custom_url: str = "",
        path_suffix: str = "",
    ) -> None:
        self._init(uid, gid, custom_url, path_suffix)
        if self._http is not None:
            self._http.close()
        self._http = self._given or HTTPTransport(
            max_connections=self.max_connections, ca_certs=self.ca_certs, client_cert=self.client_cert
        )

    # --- transport -------------------------------------------------------------
    def _request(
        self,
        method: str,
        query: Mapping[str, Any],
        body: bytes | None = None,
        accept_protobuf: bool = False,
        read_timeout: float | None = None,
        extra: Mapping[str, str] | None = None,
        idempotent: bool = True,
    ) -> Response:
        """One queue call with the SDK retry rules (``eas_sdk._core.queue_call``).

        ``idempotent=False`` (a ``get`` that deletes what it reads): once the request may
        have reached the server it is not retried; only a failure to connect is.
        """
        if self._http is None:
            self.init(self.uid, self.gid)
        http = self._http
        assert http is not None
        headers = self._fixed_headers(accept_protobuf)
        if extra:
            headers = {**headers, **extra}
        call, request = self._call(method, query, headers, body, read_timeout, idempotent)
        while True:
            try:
                resp = http.handle_request(request)
            except TransportFailure as exc:
                step = failure_step(call, exc)
            else:
                step = call.on_response(resp.status, resp.headers, resp.body, time.monotonic(), time.time())
                if step.body is not None:
                    return resp
            if step.error is not None:
                raise step.error
            if step.delay > 0:
                time.sleep(step.delay)

    # --- operations ------------------------------------------------------------
    def put(self, data: bytes | str, tags: Mapping[str, str] | None = None) -> tuple[str, str]:
        """Append a record; returns (index as a string, request id)."""
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        rid = str(uuid.uuid4())
        resp = self._request("POST", core.check_tags(tags), body, extra={C.HEADER_REQUEST_ID: rid})
        return core.parse_put(resp.body, resp.headers)

    def get(
        self,
        request_id: str | None = None,
        index: int | str = 0,
        length: int = 1,
        timeout: str = "5s",
        auto_delete: bool = True,
        tags: Mapping[str, str] | None = None,
    ) -> list[DataFrame]:
        query = core.get_query(request_id, index, length, timeout, auto_delete, tags or {})
        wait = core.duration_seconds(timeout)
        resp = self._request(
            "GET", query, accept_protobuf=True, read_timeout=wait + 1.0, idempotent=not auto_delete
        )
        return core.parse_get(resp.body)

    def attributes(self) -> dict[str, Any]:
        return core.parse_json(self._request("GET", core.ATTRS_QUERY).body)

    def search(self, index: int | str) -> dict[str, Any]:
        """Pending state of a record: {} for an invalid or unknown index (like the reference)."""
        if not core.check_index(index):
            return {}
        try:
            return core.parse_json(self._request("GET", core.search_query(index)).body)
        except PredictException as exc:
            if self.logger:
                self.logger.debug("search %s: %s", index, exc)
            return {}

    def delete(self, indexes: int | str | list[int | str]) -> str:
        return self._request("DELETE", core.indexes_query(core.index_list(indexes))).body.decode("utf-8")

    def commit(self, indexes: int | str | list[int | str]) -> bytes:
        """Acknowledge records for this client's group (idempotent; several indexes per call)."""
        return self._request("PUT", core.indexes_query(core.index_list(indexes)), b"").body

    def truncate(self, index: int | str) -> bytes:
        """Delete every record with an index below ``index``."""
        return self._request("DELETE", core.truncate_query(index)).body

    def watch(
        self,
        index: int,
        window: int,
        index_only: bool = False,
        auto_commit: bool = False,
        tags: Mapping[str, str] | None = None,
    ) -> Watcher:
        if self._http is None:
            self.init(self.uid, self.gid)
        query = core.watch_query(index, window, index_only, auto_commit, tags)
        url = core.build_url(self.base_url, query, websocket=True)
        return Watcher(
            url, self._headers(accept_protobuf=True), settings=self._watch_settings(), claim=self._watch_slot
        )

    # --- lifecycle -------------------------------------------------------------
    def close(self) -> None:
        w = self._watch_slot.current
        if w is not None:
            w.close()
        if self._http is not None:
            self._http.close()

    def destroy(self) -> None:
        self.close()

    def __enter__(self) -> QueueClient:
        if self._http is None:
            self.init(self.uid, self.gid)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
