"""The floor for a call through the gateway on this machine: our lean HTTP/1.1 front that
hands each body to a worker over the gateway's own worker RPC, and nothing else.

No service lookup, token check, request id, deadline, admission, metrics or failover:
what is left is the HTTP exchange with the client and the hop to the worker process
(``gateway.codecs.ipc``), on both sides. With ``--access-log`` each call also writes the
gateway's access line (a request id and ``gateway.core.logs.log_access``, through the
handler the gateway's command line sets up), which the gateway writes by default.
``bench_gateway.py`` runs it against the same worker as the gateway, beside the gateway
and the direct call, to show how much of the gateway's cost the hop alone takes.

Usage: python benchmarks/gateway_floor_server.py PORT WORKER_SOCKET [--access-log]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time

from aiohttp import web

from gateway.backends.supervision import CONNECTIONS_PER_WORKER
from gateway.codecs.ipc import IPCClient
from gateway.core.calls import WorkerRequest
from gateway.core.logs import ACCESS_LOGGER, log_access, setup_logging
from gateway.http.middleware import pick_request_id
from gateway.lean_http import FastProtocol, FastRequest, Hooks, Limits, Query, Reply, protocol_factory

TIMEOUT_S = 30.0


def worker_socket(pid: int) -> str:
    """The unix socket on which the worker process ``pid`` serves the gateway's RPC."""
    import psutil

    found = [str(c.laddr) for c in psutil.Process(pid).net_connections(kind="unix")]
    paths = [path for path in found if path.endswith(".sock")]
    if not paths:
        raise SystemExit(f"worker {pid}: no RPC socket found")
    return paths[0]


def handler(client: IPCClient, access_log: bool) -> Hooks:
    async def forward(req: FastRequest, query: Query) -> Reply:
        resp = await client.call(WorkerRequest(req.body), TIMEOUT_S)
        return Reply(resp.status, resp.body, resp.content_type)

    if not access_log:
        return Hooks(forward)
    setup_logging("INFO")
    access = logging.getLogger(ACCESS_LOGGER)

    async def forward_logged(req: FastRequest, query: Query) -> Reply:
        started = time.perf_counter()
        rid = pick_request_id(None)
        reply = await forward(req, query)
        ms = (time.perf_counter() - started) * 1000.0
        log_access(access, req.remote or "-", req.method, req.path, reply.status, len(reply.body), ms, rid)
        return reply

    return Hooks(forward_logged)


async def main(port: int, socket_path: str, access_log: bool) -> None:
    client = IPCClient(socket_path, CONNECTIONS_PER_WORKER)  # as many connections as the gateway's
    await client.connect()
    runner = web.AppRunner(web.Application(), access_log=None, handle_signals=False)
    await runner.setup()
    assert runner.server is not None
    conns: set[FastProtocol] = set()
    factory = protocol_factory(handler(client, access_log), runner.server, conns, Limits(1 << 20))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, "127.0.0.1", port, reuse_address=True)
    stopped = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopped.set)  # a clean exit writes the last access lines
    async with server:
        await stopped.wait()
    client.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("worker_socket")
    ap.add_argument("--access-log", action="store_true")
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(args.port, args.worker_socket, args.access_log))
