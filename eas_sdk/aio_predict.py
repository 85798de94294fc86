"""AsyncPredictClient: the asyncio twin of ``eas_sdk.predict.PredictClient``.

The same settings, core and retry rules; attempts go through an asyncio transport
(``eas_sdk._transports.AsyncHTTPTransport`` unless one is given as ``transport=``).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from types import TracebackType
from typing import Any

from ._client_base import _ClientBase, _no_endpoint, _parse, request_body
from ._discovery import async_discovery_loop
from ._transports import AsyncBaseTransport, AsyncHTTPTransport, Request, TransportFailure

__all__ = ["AsyncPredictClient"]


class AsyncPredictClient(_ClientBase):
    """Asyncio client with the same settings; ``init``/``predict``/``close`` are coroutines.

    ``async with AsyncPredictClient(endpoint, service, token=...) as client:
    resp = await client.predict(req)``.
    """

    def __init__(self, endpoint: str = "", service_name: str = "", custom_url: str = "", **kwargs: Any):
        super().__init__(endpoint, service_name, custom_url, **kwargs)
        self._http: AsyncBaseTransport | None = None
        self._init_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._ready_event: asyncio.Event | None = None

    async def init(self) -> None:
        """Apply the settings: create the connection pool and, in direct mode, start discovery."""
        await self._shutdown()
        cfg = self._prepare()
        # max_connection_count per endpoint, no total cap: in direct mode every worker
        # gets its own N connections (as in the sync client).
        self._http = self._async_transport()
        if cfg.direct:
            self._ready_event = asyncio.Event()
            discovery = self._transport or AsyncHTTPTransport(
                max_connections=1, ca_certs=self._ca_certs, client_cert=self._client_cert
            )
            self._task = asyncio.create_task(
                async_discovery_loop(
                    weakref.ref(self),
                    self._discovery_url(),
                    self._ready_event,
                    discovery,  # type: ignore[arg-type]
                ),
                name=f"eas-discovery-{self._service_name}",
            )

    async def _shutdown(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    async def predict(self, request: Any) -> Any:
        """Send ``request``; see :meth:`PredictClient.predict`."""
        if self._http is None:
            async with self._init_lock:  # one lazy init even when many tasks start at once
                if self._http is None:
                    await self.init()
        http = self._http
        assert http is not None
        body = request_body(request)
        if self._endpoints is not None and not self._endpoints.ready:
            assert self._ready_event is not None
            try:
                await asyncio.wait_for(self._ready_event.wait(), self._first_discovery_wait)
            except asyncio.TimeoutError:
                raise _no_endpoint(self._service_name, self._first_discovery_wait) from None
        call = self._new_call(body)
        while True:
            attempt = call.next_attempt(time.monotonic())
            attempt.headers.setdefault("Accept-Encoding", "identity")  # never a compressed answer
            try:
                # One timeout for the whole attempt: pool wait, connect, send, full response.
                resp = await http.handle_async_request(
                    Request("POST", attempt.url, attempt.headers, attempt.body, attempt.timeout)
                )
            except TransportFailure as exc:
                step = self._failed_attempt(call, attempt, exc)
            else:
                step = call.on_response(resp.status, resp.headers, resp.body, time.monotonic(), time.time())
                self._log_step(attempt, step, f"HTTP {resp.status}")
            if step.body is not None:
                return _parse(request, step.body)
            if step.error is not None:
                raise step.error
            if step.delay > 0:
                await asyncio.sleep(step.delay)

    async def close(self) -> None:
        """Stop discovery and close pooled connections. ``init()`` may be called again."""
        await self._shutdown()

    async def destroy(self) -> None:
        await self.close()

    async def __aenter__(self) -> AsyncPredictClient:
        if self._http is None:
            await self.init()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
