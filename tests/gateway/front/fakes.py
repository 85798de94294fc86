"""In-process fakes of the gateway's seams (WorkerPool, QueueManager) and a live-server helper."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.app import create_app
from gateway.config import Config, GatewayConfig, QueueConfig, ServiceConfig, parse_config
from gateway.core import errors
from gateway.fronts.fast_front import FastSite
from gateway.fronts.server import GatewayRunner, bound_port
from gateway.lean_http import FastRequest, Query, Reply
from gateway.queue.records import Consumer
from gateway.queue.store import Queue
from tests.gateway.doubles import BackendDouble

# The listener live_gateway starts: "fast" (FastSite, as `gateway serve` does) or "aiohttp"
# (web.TCPSite only). Set per test by the ``front`` fixture (conftest.py).
SITE = "fast"


# The gateway's own errors, as gateway.backends.pool raises them (its classes derive from these).
PoolOverloaded = errors.TooManyPending
NoReadyWorker = errors.ServiceNotReady
UpstreamTimeout = errors.UpstreamTimeout


@dataclass
class FakeWorkerRequest:
    body: bytes
    subpath: str
    content_type: str
    request_id: str
    headers: dict[str, str]
    deadline: float = 0.0


@dataclass
class FakeWorkerResponse:
    status: int
    body: bytes
    content_type: str
    compute_us: int = 100
    headers: dict[str, str] | None = None  # a backend's own answer headers, as WorkerResponse's


@dataclass
class FakePool(BackendDouble):
    service: ServiceConfig
    gateway: GatewayConfig
    # echo | overloaded | noready | timeout | crash | slow | status
    mode: str = "echo"
    ready: bool = True
    status: int = 200
    delay_s: float = 0.0
    calls: list[tuple[Any, float]] = field(default_factory=list)
    started: bool = False
    stopped: bool = False
    restarts_total: int = 0
    completed: int = 0
    cancelled: int = 0  # dispatches cancelled while they waited out delay_s

    async def start(self) -> None:
        self.started = True

    async def stop(self, drain_timeout: float) -> None:
        self.stopped = True

    async def dispatch(self, req: Any, timeout: float) -> FakeWorkerResponse:
        self.calls.append((req, timeout))
        if self.mode == "overloaded":
            raise PoolOverloaded("full")
        if self.mode == "noready":
            raise NoReadyWorker("none")
        if self.mode == "timeout":
            raise UpstreamTimeout("slow")
        if self.mode == "crash":
            raise RuntimeError("boom: secret internal detail")
        if self.delay_s:
            try:
                await asyncio.sleep(self.delay_s)  # a slow worker
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        self.completed += 1
        return FakeWorkerResponse(self.status, bytes(req.body), req.content_type)

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {"id": 0, "pid": 4242, "state": "ready" if self.ready else "starting", "http_port": 9001,
             "outstanding": 0, "restarts": 0}
        ]  # fmt: skip

    def ready_endpoints(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", 9001)] if self.ready else []


@dataclass
class FakeQueues:
    """The queue manager as the application sees it (``QueueService``), holding no queue here
    (``queues`` is empty): the lean front leaves every queue call to aiohttp, whose route
    calls ``handle``."""

    names: set[str]
    handled: list[tuple[str, str, bytes | None]] = field(default_factory=list)
    started: bool = False
    closing: bool = False
    backend_name: str = "fake"
    queues: dict[str, Queue] = field(default_factory=dict)
    dispatchers: dict[str, Any] = field(default_factory=dict)
    listeners: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    watchers: set[web.WebSocketResponse] = field(default_factory=set)
    advertised: tuple[str, int] | None = None

    @property
    def configs(self) -> dict[str, QueueConfig]:
        return {n: QueueConfig() for n in self.names}

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    async def shutdown(self) -> None:
        self.closing = True

    def advertise(self, host: str, port: int) -> None:
        self.advertised = (host, port)

    def has(self, name: str) -> bool:
        return name in self.names

    async def handle(self, request: web.Request, queue_name: str) -> web.StreamResponse:
        body = await request.read() if request.body_exists else None
        self.handled.append((request.method, queue_name, body))
        return web.Response(text="7", headers={"X-Eas-Queueservice-Request-Id": "rid-1"})

    async def forward(self, queue_name: str, req: FastRequest, query: Query) -> Reply:
        return Reply(503, b"served by no gateway", "text/plain")

    async def wait_visible(self, name: str, timeout: float) -> None:
        pass

    def schedule_release(self, q: Queue, c: Consumer) -> None:
        pass

    def storage_failure(self) -> str | None:
        return None

    def snapshot(self) -> dict[str, Any]:
        return {"queues": {n: {"length": 3} for n in self.names}}


# The config must name files that exist (the pools are fakes and never load them).
SAMPLES = Path(__file__).resolve().parents[3] / "samples"
DIGITS_MODEL = str(SAMPLES / "models" / "digits.onnx")  # built by the suite's conftest
ECHO_ENTRY = f"{SAMPLES / 'processors' / 'echo.py'}:EchoProcessor"

TOKEN = "digits-token-0123456789abcdef"
OTHER_TOKEN = "other-token-fedcba9876543210"


def make_config(**gateway: Any) -> Config:
    gw = {"host": "127.0.0.1", "port": 0, "body_timeout_s": 2.0, "header_timeout_s": 2.0}
    gw.update(gateway)
    return parse_config(
        {
            "gateway": gw,
            "services": [
                {
                    "name": "digits",
                    "processor": "onnx",
                    "placement": "process",
                    "model": DIGITS_MODEL,
                    "token": TOKEN,
                    "workers": 2,
                },
                {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, "public": True},
                {"name": "other", "processor": "python", "entry": ECHO_ENTRY, "token": OTHER_TOKEN},
                {"name": "q", "processor": "queue", "workers": 0, "token": TOKEN},
            ],
        }
    )


@dataclass
class Live:
    app: web.Application
    runner: GatewayRunner
    port: int
    pools: dict[str, FakePool]
    queues: FakeQueues

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def live_gateway(config: Config | None = None, **gateway: Any) -> AsyncIterator[Live]:
    cfg = config or make_config(**gateway)
    pools: dict[str, FakePool] = {}
    queues = FakeQueues({"q", "q/sink"})

    def pool_factory(svc: ServiceConfig, gw: GatewayConfig) -> FakePool:
        pools[svc.name] = FakePool(svc, gw)
        return pools[svc.name]

    app = create_app(
        cfg, pool_factory=pool_factory, queue_factory=lambda c: queues, worker_request=FakeWorkerRequest
    )
    runner = GatewayRunner(app)
    await runner.setup()
    try:
        site: web.TCPSite
        if SITE == "fast":
            site = FastSite(runner, "127.0.0.1", 0, conns=runner.fast_conns)
        else:
            site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield Live(app, runner, bound_port(runner), pools, queues)
    finally:
        await runner.cleanup()


async def raw_request(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes, return everything the server sends until it closes (or timeout)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        chunks = []
        async with asyncio.timeout(timeout):
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if b"Connection: close" not in b"".join(chunks) and _complete(b"".join(chunks)):
                    break
        return b"".join(chunks)
    finally:
        await close_writer(writer)


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


def _complete(buf: bytes) -> bool:
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False
