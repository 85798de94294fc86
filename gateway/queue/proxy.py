"""Forwarding a queue call to the gateway that serves the queue (the owner lease's holder).

Several gateways on one Redis serve the same queues; one of them holds each store's
lease (``lease.py``) and the others pass calls through: a plain call is sent on and its
answer returned as it came, a watch is relayed frame by frame both ways. The caller was
authenticated here; the owner authenticates again (the same services file), and a call
that was already forwarded once is never forwarded again (the owner changed meanwhile:
503, the client retries).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web

from gateway.lean_http import Reply
from gateway.queue.records import QueueError

log = logging.getLogger(__name__)

FORWARDED = "X-Easgw-Queue-Forwarded"
# Hop-by-hop and framing headers: the forwarding connection has its own.
_DROP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
        "Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Extensions", "Sec-WebSocket-Accept",
        "Proxy-Authorization", "TE", "Trailer",
    )
)  # fmt: skip
_KEEP_BACK = ("X-Eas-Queueservice-Request-Id", "Retry-After", "Allow")
CONNECT_TIMEOUT_S = 3.0


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    out = {k: v for k, v in headers.items() if k.lower() not in _DROP}
    out[FORWARDED] = "1"
    return out


def unavailable(owner: str | None, why: str) -> QueueError:
    where = f" (served by {owner})" if owner else ""
    return QueueError(503, f"queue unavailable{where}: {why}; retry")


class Forwarder:
    """One client session for every forwarded call of a gateway."""

    def __init__(self, timeout_s: float = 75.0) -> None:
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self.forwarded_total = 0

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=CONNECT_TIMEOUT_S),
                auto_decompress=False,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(
        self, owner: str, method: str, path_qs: str, headers: Mapping[str, str], body: bytes
    ) -> Reply:
        """A plain call, answered with the owner's status, body and queue headers."""
        self.forwarded_total += 1
        try:
            async with self.session.request(
                method, f"http://{owner}{path_qs}", headers=forward_headers(headers), data=body or None
            ) as resp:
                data = await resp.read()
                back = {h: resp.headers[h] for h in _KEEP_BACK if h in resp.headers}
                ctype = resp.headers.get("Content-Type", "text/plain; charset=utf-8")
                return Reply(resp.status, data, ctype, back or None)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise unavailable(owner, f"cannot reach it ({type(exc).__name__})") from None

    async def watch(self, owner: str, request: web.Request) -> web.StreamResponse:
        """Relay a watch: the client's handshake is answered only once the owner accepted it,
        so a refusal (bad window, token) reaches the client as the owner's own answer."""
        url = f"http://{owner}{request.raw_path}"
        self.forwarded_total += 1
        try:
            upstream = await self.session.ws_connect(
                url, headers=forward_headers(request.headers), autoping=True, heartbeat=5.0, max_msg_size=0
            )
        except aiohttp.WSServerHandshakeError as exc:
            # Its parameters were checked here already: what is left comes from the queue's
            # state (409 tags), auth or availability; the client's handling goes by the status.
            return web.Response(
                status=exc.status, text="the watch was refused by the gateway serving this queue"
            )
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            err = unavailable(owner, f"cannot reach it ({type(exc).__name__})")
            return web.Response(status=err.status, text=err.message, headers={"Retry-After": "1"})
        ws = web.WebSocketResponse(autoping=True, heartbeat=None, max_msg_size=64 * 1024, compress=False)
        try:
            await ws.prepare(request)
        except BaseException:
            await upstream.close()
            raise
        down = asyncio.ensure_future(_pump_down(upstream, ws))
        try:
            await _relay(ws, upstream)  # the client's frames (the owner refuses data frames itself)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            down.cancel()
            with contextlib.suppress(BaseException):
                await down
            with contextlib.suppress(Exception):
                await upstream.close()
            if not ws.closed:
                code = upstream.close_code or WSCloseCode.GOING_AWAY
                with contextlib.suppress(Exception):
                    await ws.close(code=code)
        return ws


async def _relay(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
) -> None:
    """Data frames from ``source`` to ``sink`` until ``source`` closes or sends anything else."""
    async for msg in source:
        if msg.type == WSMsgType.BINARY:
            await sink.send_bytes(msg.data)
        elif msg.type == WSMsgType.TEXT:
            await sink.send_str(msg.data)
        else:
            break


async def _pump_down(upstream: aiohttp.ClientWebSocketResponse, ws: web.WebSocketResponse) -> None:
    """The owner's frames to the client; when the owner goes away the client is told so
    (1001) and reconnects, here or elsewhere."""
    try:
        await _relay(upstream, ws)
    except Exception as exc:
        log.debug("watch relay stopped: %s", exc)
    code = upstream.close_code
    if code is None or code == WSCloseCode.ABNORMAL_CLOSURE:
        code = WSCloseCode.GOING_AWAY
    with contextlib.suppress(Exception):
        await ws.close(code=code)
