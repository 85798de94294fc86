"""A queue-only server: the queue routes plus token checks, nothing else.

Used by the queue tests and the queue benchmark so they do not depend on the
full gateway; the full gateway mounts the same QueueManager behind its own
routes. ``python -m gateway.queue.server --config cfg.yaml [--port 0]
[--port-file F]`` serves until SIGTERM/SIGINT.
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
from gateway.auth import verify
from gateway.config import Config, load_config

from .manager import QueueManager

MANAGER_KEY = web.AppKey("queue_manager", QueueManager)


def build_app(config: Config, data_dir: str | None = None) -> web.Application:
    mgr = QueueManager(config, data_dir)
    max_payload = max((c.max_payload_bytes for c in mgr.configs.values()), default=1 << 20)
    app = web.Application(client_max_size=max_payload + 4096)
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


def _write_port_file(path: str, text: str) -> None:
    tmp = path + ".tmp"
    Path(tmp).write_text(text)
    os.replace(tmp, path)  # atomic: a reader never sees half a line


async def _serve(config: Config, host: str, port: int, port_file: str | None) -> None:
    app = build_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = getattr(site, "_server", None)
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    if port_file:
        _write_port_file(port_file, f"{host}:{bound}\n")
    print(f"queue server listening on {host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gateway.queue.server")
    ap.add_argument("--config", required=True)
    ap.add_argument("--host", default=None)
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--port-file", default=None)
    ap.add_argument("--uvloop", action="store_true")
    args = ap.parse_args(argv)
    config = load_config(args.config)
    host = args.host or config.gateway.host
    port = config.gateway.port if args.port is None else args.port
    if args.uvloop:
        import uvloop

        uvloop.install()
    asyncio.run(_serve(config, host, port, args.port_file or config.gateway.port_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
