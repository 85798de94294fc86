"""Direct-mode service discovery: refresh a client's endpoint list in the background.

One loop per client, a thread for PredictClient and a task for AsyncPredictClient.
Each holds only a weak reference to its client, so an abandoned client is
collected and its loop ends. A failed round keeps the last good list.
"""

from __future__ import annotations

import asyncio
import threading
import weakref

from ._client_base import _ClientBase
from ._transports import AsyncBaseTransport, BaseTransport, Request, TransportFailure


def _deliver(
    ref: weakref.ReferenceType[_ClientBase],
    status: int | None,
    data: bytes,
    error: str | None,
    ready: threading.Event | asyncio.Event,
) -> bool:
    """Hand one round's answer to the client; False once the client is gone (the loop then ends).

    Only a weak reference is held between rounds, so that an unreferenced client can be collected.
    """
    client = ref()
    if client is None:
        return False
    client._discovery_result(status, data, error)
    if client._endpoints is not None and client._endpoints.ready:
        ready.set()
    return True


def _settings(ref: weakref.ReferenceType[_ClientBase]) -> tuple[float, float] | None:
    """The client's (interval, timeout) between rounds; None when it is gone already."""
    client = ref()
    if client is None:
        return None
    return client._discovery_interval, client._discovery_timeout


def sync_discovery_loop(
    ref: weakref.ReferenceType[_ClientBase],
    url: str,
    stop: threading.Event,
    ready: threading.Event,
    transport: BaseTransport,
) -> None:
    """Refresh the endpoint list until ``stop`` is set or the client is gone."""
    settings = _settings(ref)
    if settings is None:
        return
    interval, timeout = settings
    try:
        while not stop.is_set():
            status: int | None = None
            data, error = b"", None
            try:
                # A hanging or trickling discovery server costs at most `timeout` per round.
                resp = transport.handle_request(Request("GET", url, {}, None, timeout))
                status, data = resp.status, resp.body
            except TransportFailure as exc:  # any failure keeps the last list
                error = exc.reason
            if stop.is_set() or not _deliver(ref, status, data, error, ready):
                return
            stop.wait(interval)
    finally:
        transport.close()


async def async_discovery_loop(
    ref: weakref.ReferenceType[_ClientBase], url: str, ready: asyncio.Event, transport: AsyncBaseTransport
) -> None:
    """Refresh the endpoint list until cancelled or the client is gone."""
    settings = _settings(ref)
    if settings is None:
        return
    interval, timeout = settings
    try:
        while True:
            status: int | None = None
            data, error = b"", None
            try:
                resp = await transport.handle_async_request(Request("GET", url, {}, None, timeout))
                status, data = resp.status, resp.body
            except TransportFailure as exc:  # any failure keeps the last list
                error = exc.reason
            if not _deliver(ref, status, data, error, ready):
                return
            await asyncio.sleep(interval)
    finally:
        await transport.aclose()
