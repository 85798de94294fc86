"""A queue-only server: the queue routes plus token checks, nothing else.

Used by the queue tests and the queue benchmark so they do not depend on the
full gateway; the full gateway mounts the same QueueManager behind its own
routes. ``python -m gateway.queue.server --config cfg.yaml [--port 0]
[--port-file F]`` serves until SIGTERM/SIGINT.

Plain queue calls are answered by a lean HTTP/1.1 protocol (gateway/lean_http) with the
same handlers and token check; WebSocket watches and anything unusual go to the
aiohttp application below (``--no-fast-path`` serves everything with aiohttp).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from eas_sdk._core.constants import PREDICT_PATH_PREFIX
from gateway.config import Config, load_config
from gateway.core.auth import verify
from gateway.lean_http import (
    FastProtocol,
    FastRequest,
    Hooks,
    Limits,
    Query,
    Serve,
    close_all,
    protocol_factory,
)
from gateway.queue.datadir import StoreUnusable
from gateway.queue.http import Reply, dispatch
from gateway.queue.manager import QueueManager
from gateway.queue.replies import text

MANAGER_KEY = web.AppKey("queue_manager", QueueManager)


def max_body(mgr: QueueManager) -> int:
    return max((c.max_payload_bytes for c in mgr.configs.values()), default=1 << 20) + 4096


def build_app(config: Config, data_dir: str | None = None) -> web.Application:
    mgr = QueueManager(config, data_dir)
    app = web.Application(client_max_size=max_body(mgr))
    app[MANAGER_KEY] = mgr

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await mgr.start()
        yield
        await mgr.stop()

    app.cleanup_ctx.append(lifecycle)

    async def on_shutdown(app: web.Application) -> None:
        await mgr.shutdown()

    app.on_shutdown.append(on_shutdown)

    async def route(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        svc = mgr.service_for(name)
        if svc is None:
            return web.Response(status=404, text=f"service {name!r} not found")
        result = verify(svc.tokens, request.headers, request.path, None)
        if not result.ok:
            return web.Response(status=401, text=result.reason)
        return await mgr.handle(request, name)

    app.router.add_route("*", PREDICT_PATH_PREFIX + "{name:.+}", route)
    return app


def fast_route(mgr: QueueManager) -> Serve:
    """The fast path's twin of ``route`` above: the same lookups, token check and handlers."""
    prefix_len = len(PREDICT_PATH_PREFIX)
    # (queue, Authorization value) pairs that verified: a client sends the same raw token on
    # every call, and two SHA-256 digests per call were a visible part of a call's CPU.
    # Only successes are kept (bounded); a dict lookup compares strings only on a hash match.
    verified: dict[tuple[str, str], None] = {}

    async def serve(req: FastRequest, query: Query) -> Reply:
        name = req.path[prefix_len:]
        svc = mgr.service_for(name)
        if svc is None:
            return text(404, f"service {name!r} not found")
        key = (name, req.headers.get("Authorization") or "")
        if key not in verified:
            result = verify(svc.tokens, req.headers, req.path, None)
            if not result.ok:
                return text(401, result.reason)
            if len(verified) >= 1024:
                verified.clear()
            verified[key] = None
        q = mgr.queues.get(name)
        if q is None:
            if mgr.has(name):  # served by another gateway on the same Redis
                return await mgr.forward(name, req, query)
            return text(404, f"queue {name!r} not found")
        return await dispatch(mgr, q, req, query)

    return serve


def _write_port_file(path: str, text: str) -> None:
    tmp = path + ".tmp"
    Path(tmp).write_text(text)
    os.replace(tmp, path)  # atomic: a reader never sees half a line


async def _serve(config: Config, host: str, port: int, port_file: str | None, fast: bool = True) -> None:
    app = build_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    loop = asyncio.get_running_loop()
    conns: set[FastProtocol] = set()
    listener: asyncio.AbstractServer | None = None
    site: web.TCPSite | None = None
    if fast:
        aio = runner.server
        assert aio is not None
        serve = fast_route(app[MANAGER_KEY])
        limit = max_body(app[MANAGER_KEY])
        listener = await loop.create_server(
            protocol_factory(Hooks(serve), aio, conns, Limits(limit)), host, port, reuse_address=True
        )
        sockets = list(listener.sockets)
    else:
        site = web.TCPSite(runner, host, port)
        await site.start()
        sockets = list(getattr(getattr(site, "_server", None), "sockets", None) or [])
    bound = sockets[0].getsockname()[1] if sockets else port
    app[MANAGER_KEY].advertise(config.gateway.advertise_host or host, bound)
    if port_file:
        _write_port_file(port_file, f"{host}:{bound}\n")
    print(f"queue server listening on {host}:{bound}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if listener is not None:
        listener.close()
        await app[MANAGER_KEY].shutdown()  # long polls answer now, so busy connections finish
        await close_all(conns, timeout=5.0)
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gateway.queue.server")
    ap.add_argument("--config", required=True)
    ap.add_argument("--host", default=None)
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--port-file", default=None)
    ap.add_argument("--uvloop", action="store_true")
    ap.add_argument("--no-fast-path", action="store_true", help="serve every call with aiohttp")
    args = ap.parse_args(argv)
    config = load_config(args.config)
    host = args.host or config.gateway.host
    port = config.gateway.port if args.port is None else args.port
    if args.uvloop:
        import uvloop

        uvloop.install()
    try:
        asyncio.run(
            _serve(config, host, port, args.port_file or config.gateway.port_file, not args.no_fast_path)
        )
    except StoreUnusable as exc:  # locked by another gateway, missing, corrupt, unwritable
        print(f"queue server: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
