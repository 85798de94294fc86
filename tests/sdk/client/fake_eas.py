"""A small EAS-compatible test server (aiohttp, 127.0.0.1, own thread and loop).

* ``POST /api/predict/<service...>``: checks the token with ``gateway.core.auth.verify``
  (raw token and EAS HMAC), then runs the next scripted action or the default
  answer: a real protobuf echo for services named ``tf*``, ``torch*`` and
  ``blade*``, the body itself otherwise.
* ``GET /api/v1/servicediscovery/upstreams/<svc>``: the discovery document set by
  the test (or a scripted status).

Every request is recorded (headers, body, client port) so tests can count attempts
and inspect exactly what went over the wire. Usable from sync and async tests alike
because the server runs in its own thread.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from eas_sdk._proto import blade_pb2, tf_predict_pb2, torch_predict_pb2
from gateway.core.auth import verify


@dataclass
class Record:
    method: str
    path: str
    query: str
    headers: CIMultiDict[str]  # case-insensitive, as on the wire
    body: bytes
    peer_port: int
    auth_ok: bool
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b""
    headers: dict[str, str] | None = None
    delay: float = 0.0  # seconds to wait before answering


@dataclass(frozen=True)
class Delay:
    seconds: float  # then the default answer


@dataclass(frozen=True)
class Drop:
    """Close the connection without any response byte."""


@dataclass(frozen=True)
class Trickle:
    """Send the headers at once, then a ``length``-byte body one byte every ``interval`` seconds."""

    length: int = 10
    interval: float = 0.15


@dataclass(frozen=True)
class Truncate:
    """Announce ``Content-Length: declared``, send ``sent`` bytes of it, then close the connection."""

    declared: int = 10
    sent: int = 3


Action = Reply | Delay | Drop | Trickle | Truncate


def _tf_echo(body: bytes) -> bytes:
    req = tf_predict_pb2.PredictRequest.FromString(body)
    resp = tf_predict_pb2.PredictResponse()
    for name, array in req.inputs.items():
        resp.outputs[name].CopyFrom(array)
    first = next(iter(req.inputs.values()), None)
    for name in req.output_filter:
        if first is not None and name not in resp.outputs:
            resp.outputs[name].CopyFrom(first)
    return resp.SerializeToString()


def _torch_echo(body: bytes) -> bytes:
    req = torch_predict_pb2.PredictRequest.FromString(body)
    resp = torch_predict_pb2.PredictResponse()
    resp.outputs.extend(req.inputs)
    for name, array in req.map_inputs.items():
        resp.map_outputs[name].CopyFrom(array)
    return resp.SerializeToString()


def _blade_echo(body: bytes) -> bytes:
    req = blade_pb2.Request.FromString(body)
    resp = blade_pb2.Response()
    for array in req.inputs:
        out = resp.outputs.add()
        out.CopyFrom(array)
    for info in req.output_info:
        if req.inputs:
            out = resp.outputs.add()
            out.CopyFrom(req.inputs[0])
            out.name_in_dl_model = info.name_in_dl_model
            out.blade_blob_name = info.blade_blob_name
    return resp.SerializeToString()


def default_answer(service: str, body: bytes) -> bytes:
    if service.startswith("tf"):
        return _tf_echo(body)
    if service.startswith("torch"):
        return _torch_echo(body)
    if service.startswith("blade"):
        return _blade_echo(body)
    return body


class FakeEAS:
    def __init__(
        self,
        tokens: Iterable[str] = (),
        keepalive_timeout: float = 75.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.tokens = list(tokens)
        self.ssl_context = ssl_context
        self.keepalive_timeout = keepalive_timeout
        self.records: list[Record] = []
        self.discovery_hits: list[float] = []
        self.script: deque[Action] = deque()
        self.default: Action | None = None  # used when the script is empty
        self.discovery: Callable[[], tuple[int, bytes]] | None = None
        self.discovery_hang = False  # accept discovery requests and never answer
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- control from tests -------------------------------------------------------------
    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def predicts(self) -> list[Record]:
        return [r for r in self.records if r.method == "POST"]

    def push(self, *actions: Action) -> None:
        self.script.extend(actions)

    def set_endpoints(self, items: list[dict[str, Any]]) -> None:
        doc = json.dumps({"endpoints": {"items": items}}).encode()
        self.discovery = lambda: (200, doc)

    def reset(self) -> None:
        self.records.clear()
        self.script.clear()
        self.default = None

    # -- server ---------------------------------------------------------------------------
    async def _predict(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        result = verify(self.tokens, request.headers, request.path, body)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.records.append(
            Record(
                "POST",
                request.path,
                request.query_string,
                CIMultiDict(request.headers),
                body,
                peer[1] if peer else 0,
                result.ok,
            )
        )
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if not result.ok:
                return web.Response(status=401, text="Unauthorized")
            action = self.script.popleft() if self.script else self.default
            if isinstance(action, Reply):
                if action.delay:
                    await asyncio.sleep(action.delay)
                return web.Response(status=action.status, body=action.body, headers=action.headers)
            if isinstance(action, Drop):
                assert request.transport is not None
                request.transport.abort()
                raise asyncio.CancelledError
            if isinstance(action, (Trickle, Truncate)):
                return await self._partial(request, action)
            if isinstance(action, Delay):
                await asyncio.sleep(action.seconds)
            service = request.match_info["service"]
            return web.Response(body=default_answer(service, body))
        finally:
            with self._lock:
                self.active -= 1

    async def _partial(self, request: web.Request, action: Trickle | Truncate) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_length = action.length if isinstance(action, Trickle) else action.declared
        await resp.prepare(request)
        try:
            if isinstance(action, Truncate):
                await resp.write(b"x" * action.sent)
                await asyncio.sleep(0.05)  # let the bytes leave before the close
                assert request.transport is not None
                request.transport.close()
                raise asyncio.CancelledError
            for _ in range(action.length):
                await resp.write(b"x")
                await asyncio.sleep(action.interval)
            await resp.write_eof()
        except ConnectionError:
            pass  # the client gave up
        return resp

    async def _discovery(self, request: web.Request) -> web.Response:
        self.discovery_hits.append(time.monotonic())
        if self.discovery_hang:
            await asyncio.sleep(3600)  # cancelled when the client goes away or the server stops
        if self.discovery is None:
            return web.Response(status=404, text="no discovery configured")
        status, body = self.discovery()
        return web.Response(status=status, body=body, content_type="application/json")

    def start(self) -> FakeEAS:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                app = web.Application()
                app.router.add_post("/api/predict/{service:.+}", self._predict)
                app.router.add_get("/api/v1/servicediscovery/upstreams/{svc}", self._discovery)
                runner = web.AppRunner(
                    app, access_log=None, keepalive_timeout=self.keepalive_timeout, shutdown_timeout=0.2
                )
                loop.run_until_complete(runner.setup())
                site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
                loop.run_until_complete(site.start())
                self._runner = runner
                server = site._server
                assert server is not None
                self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            except BaseException as exc:
                errors.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-eas", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None and thread is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
