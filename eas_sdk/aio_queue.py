"""AsyncQueueClient: the asyncio twin of ``eas_sdk.queue.QueueClient``, same rules."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from ._core import constants as C
from ._core import queue as core
from ._core.queue import DataFrame
from ._queue_base import WatchSlot, _Base, failure_step
from ._transports import AsyncBaseTransport, AsyncHTTPTransport, TransportFailure
from .errors import PredictException
from .watcher import AsyncWatcher

__all__ = ["AsyncQueueClient"]


class AsyncQueueClient(_Base):
    """The asyncio twin of QueueClient (the asyncio SDK transport for HTTP, websockets for watch)."""

    def __init__(self, endpoint: str = "", queue_name: str = "", custom_url: str = "", **kwargs: Any) -> None:
        super().__init__(endpoint, queue_name, custom_url)
        self.max_connections = int(kwargs.get("max_connections", 100))
        self._http: AsyncBaseTransport | None = None
        self._given: AsyncBaseTransport | None = kwargs.get("transport")  # e.g. a MockTransport in tests
        self.ca_certs: str | None = kwargs.get("ca_certs")  # a PEM bundle trusted instead of the system's
        self.client_cert: str | tuple[str, str] | None = kwargs.get("client_cert")  # for mTLS
        self._watch_slot: WatchSlot[AsyncWatcher] = WatchSlot()  # one running watcher, as QueueClient

    def init(
        self,
        uid: str | None = None,
        gid: str = C.DEFAULT_QUEUE_GROUP,
        custom_url: str = "",
        path_suffix: str = "",
    ) -> None:
        self._init(uid, gid, custom_url, path_suffix)

    async def _request(
        self,
        method: str,
        query: Mapping[str, Any],
        body: bytes | None = None,
        accept_protobuf: bool = False,
        read_timeout: float | None = None,
        extra: Mapping[str, str] | None = None,
        idempotent: bool = True,
    ) -> tuple[int, bytes, Mapping[str, str]]:
        """One queue call with the SDK retry rules; see ``QueueClient._request`` for ``idempotent``."""
        if self._http is None:
            self._http = self._given or AsyncHTTPTransport(
                max_connections=self.max_connections, ca_certs=self.ca_certs, client_cert=self.client_cert
            )
        http = self._http
        headers = self._headers(accept_protobuf)
        if extra:
            headers.update(extra)
        call, request = self._call(method, query, headers, body, read_timeout, idempotent)
        while True:
            try:
                resp = await http.handle_async_request(request)
            except TransportFailure as exc:
                step = failure_step(call, exc)
            else:
                step = call.on_response(resp.status, resp.headers, resp.body, time.monotonic(), time.time())
                if step.body is not None:
                    return resp.status, resp.body, resp.headers
            if step.error is not None:
                raise step.error
            if step.delay > 0:
                await asyncio.sleep(step.delay)

    async def put(self, data: bytes | str, tags: Mapping[str, str] | None = None) -> tuple[str, str]:
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        _, out, headers = await self._request(
            "POST", core.check_tags(tags), body, extra={C.HEADER_REQUEST_ID: str(uuid.uuid4())}
        )
        return core.parse_put(out, headers)

    async def get(
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
        _, out, _ = await self._request(
            "GET", query, accept_protobuf=True, read_timeout=wait + 1.0, idempotent=not auto_delete
        )
        return core.parse_get(out)

    async def attributes(self) -> dict[str, Any]:
        return core.parse_json((await self._request("GET", core.ATTRS_QUERY))[1])

    async def search(self, index: int | str) -> dict[str, Any]:
        if not core.check_index(index):
            return {}
        try:
            return core.parse_json((await self._request("GET", core.search_query(index)))[1])
        except PredictException:
            return {}

    async def delete(self, indexes: int | str | list[int | str]) -> str:
        out = (await self._request("DELETE", core.indexes_query(core.index_list(indexes))))[1]
        return out.decode("utf-8")

    async def commit(self, indexes: int | str | list[int | str]) -> bytes:
        return (await self._request("PUT", core.indexes_query(core.index_list(indexes)), b""))[1]

    async def truncate(self, index: int | str) -> bytes:
        return (await self._request("DELETE", core.truncate_query(index)))[1]

    def watch(
        self,
        index: int,
        window: int,
        index_only: bool = False,
        auto_commit: bool = False,
        tags: Mapping[str, str] | None = None,
    ) -> AsyncWatcher:
        query = core.watch_query(index, window, index_only, auto_commit, tags)
        url = core.build_url(self.base_url, query, websocket=True)
        return AsyncWatcher(
            url, self._headers(accept_protobuf=True), settings=self._watch_settings(), claim=self._watch_slot
        )

    async def close(self) -> None:
        w = self._watch_slot.current
        if w is not None:
            await w.close()
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    async def __aenter__(self) -> AsyncQueueClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
