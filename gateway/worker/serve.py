"""The worker's serve loop: load the processor, serve it two ways, report readiness, drain.

* the framed RPC (gateway.codecs.ipc) on a unix socket: what the gateway uses (on TCP
  for a remote worker, started by ``eas-gateway worker``: gateway.remote.agent);
* HTTP on ``gateway.worker_host`` (default 127.0.0.1), port 0, for direct-mode clients
  (gateway.worker.direct).

Once both listen, the worker answers the pool once over its pipe: its readiness (pid,
http port, socket path and the processor's model metadata) or its load error. EOF on
that pipe means the gateway is gone and the worker stops. SIGTERM drains: stop
accepting, finish what is queued (bounded), return. SIGINT is ignored so a Ctrl-C to the
process group lets the gateway stop workers in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

from gateway.codecs.ipc import TCP_PREFIX, IPCServerProtocol, split_tcp
from gateway.config import GatewayConfig, ServiceConfig
from gateway.core.heap import freeze_startup_heap
from gateway.core.tls import ServerTls
from gateway.lean_http import FastProtocol, Limits, close_all, protocol_factory
from gateway.worker.compute import ComputeQueue
from gateway.worker.direct import DirectHTTP
from gateway.worker.processors.base import LoadError
from gateway.worker.processors.registry import create_processor
from gateway.worker.tracing import worker_tracing

log = logging.getLogger("gateway.worker")


async def serve(
    service: ServiceConfig,
    gateway: GatewayConfig,
    socket_path: str,
    conn: Any,
    drain_s: float,
    loud: bool = True,
    key: str | None = None,
    tls: ServerTls | None = None,
) -> int:
    """Serve until SIGTERM or EOF on ``conn``. ``socket_path``: the RPC's unix socket, or
    ``tcp://host:port`` for a remote worker, whose connections must open with ``key``, over
    ``tls`` when given (default: ``gateway.worker_tls``'s; the caller reloads it).
    ``loud``: log a failed load at ERROR with its traceback (a first attempt); DEBUG otherwise."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    processor = create_processor(service)
    processor.max_response_bytes = gateway.max_response_bytes
    try:
        processor.load()
        # Asked once, here: a processor whose metadata cannot be given does not start.
        metadata = processor.metadata()
    except BaseException as exc:
        first = str(exc).splitlines()[0][:300] if str(exc) else ""
        msg = first if isinstance(exc, LoadError) else f"{type(exc).__name__}: {first}"
        level = logging.ERROR if loud else logging.DEBUG
        log.log(level, "service %s: processor failed to load: %s", service.name, msg, exc_info=loud)
        conn.send({"ok": False, "error": msg})
        return 3

    compute = ComputeQueue(
        loop,
        processor,
        max_batch_size=service.batching.max_batch_size,
        max_latency_ms=service.batching.max_latency_ms,
        stall_s=service.stall_timeout_s,
    )
    # Spans for the calls the gateway traces (gateway.trace_endpoint), joined to its trace.
    tracing = worker_tracing(gateway, service.name)
    if tracing is not None:
        compute.traced = tracing.record
    limit = gateway.max_response_bytes
    if socket_path.startswith(TCP_PREFIX):
        # A remote worker: the gateway connects over TCP and must say the worker token first.
        host, port = split_tcp(socket_path)
        # With worker_tls, over mutual TLS: the gateway must present a certificate of its CA.
        if tls is None and gateway.worker_tls is not None:
            tls = ServerTls(gateway.worker_tls, alpn=())
        server = await loop.create_server(
            lambda: IPCServerProtocol(compute, limit, key),
            host,
            port,
            backlog=128,
            ssl=tls.context if tls is not None else None,
        )
        socket_path = f"{TCP_PREFIX}{host}:{server.sockets[0].getsockname()[1]}"
    else:
        server = await loop.create_unix_server(lambda: IPCServerProtocol(compute, limit), path=socket_path)
        os.chmod(socket_path, 0o600)

    from aiohttp import web

    # Direct mode's HTTP port: plain predict calls on the lean protocol, the rest on aiohttp.
    direct = DirectHTTP(service, gateway, compute)
    runner = web.AppRunner(direct.app(), access_log=None)
    await runner.setup()
    fallback = runner.server
    assert fallback is not None
    conns: set[FastProtocol] = set()

    # The gateway's connection limits apply on the worker's port too.
    http_protocol = protocol_factory(direct, fallback, conns, Limits.of(gateway, gateway.max_body_bytes))
    http_server = await loop.create_server(http_protocol, gateway.worker_host, 0, backlog=1024)
    port = http_server.sockets[0].getsockname()[1]

    # The pipe to the gateway: EOF means the gateway died, so stop too.
    def _parent_event() -> None:
        try:
            if conn.poll():
                conn.recv()
        except (EOFError, OSError):
            loop.remove_reader(conn.fileno())
            stop.set()

    loop.add_reader(conn.fileno(), _parent_event)
    freeze_startup_heap()
    ready = {
        "ok": True, "pid": os.getpid(), "http_port": port, "socket": socket_path, "metadata": metadata,
        "providers": processor.providers_used,
    }  # fmt: skip
    conn.send(ready)
    log.info(
        "service %s: worker ready (pid %d, http %s:%d)", service.name, os.getpid(), gateway.worker_host, port
    )

    await stop.wait()
    # Drain: no new connections, finish what is queued, then leave.
    server.close()
    http_server.close()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(compute.idle.wait(), drain_s)
    await close_all(conns, timeout=1.0)
    await runner.cleanup()  # the connections handed to aiohttp
    compute.shutdown()
    with contextlib.suppress(Exception):
        processor.close()
    if tracing is not None:
        tracing.shutdown()  # send the last spans: the process ends without its exit hooks
    return 0
