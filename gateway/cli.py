"""``eas-gateway serve --config services.yaml`` (also ``python -m gateway serve ...``).

Start-up: load and validate the config (errors name the field, exit 2), bind,
log the address, start the worker pools, wait until they are ready (at most
``worker_start_timeout_s``), then print ``gateway listening on http://H:P`` on
stdout and write ``H:P`` to ``--port-file`` atomically.

Shutdown on SIGTERM/SIGINT: /readyz answers 503 at once, requests are still served
for ``drain_delay_s`` (default 0; a second signal cuts it short), the listener closes,
idle keep-alive connections close, in-flight requests finish (up to
``shutdown_timeout_s``), worker pools drain and stop, exit status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import ipaddress
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gateway import __version__
from gateway.config import Config, ConfigError, load_config, open_service_warnings

log = logging.getLogger("gateway")

EXIT_CONFIG = 2
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eas-gateway", description="EAS-compatible inference gateway")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the gateway")
    s.add_argument("--config", "-c", required=True, help="services YAML file")
    s.add_argument("--host", help="listen address (overrides gateway.host)")
    s.add_argument("--port", type=int, help="listen port, 0 picks a free one (overrides gateway.port)")
    s.add_argument("--grpc-port", type=int, help="V2 gRPC port, 0 for none (overrides gateway.grpc_port)")
    s.add_argument("--port-file", help="write 'host:port' here once ready (overrides gateway.port_file)")
    s.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, help="overrides gateway.log_level")
    s.add_argument("--log-format", choices=("text", "json"), help="overrides gateway.log_format")
    return p


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_config(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config)
    changes: dict[str, Any] = {}
    if args.host is not None:
        changes["host"] = args.host
    if args.port is not None:
        if not 0 <= args.port <= 65535:
            raise ConfigError(f"--port: must be between 0 and 65535, got {args.port}")
        changes["port"] = args.port
    if args.grpc_port is not None:
        if not 0 <= args.grpc_port <= 65535:
            raise ConfigError(f"--grpc-port: must be between 0 and 65535, got {args.grpc_port}")
        changes["grpc_port"] = args.grpc_port
    if args.port_file is not None:
        changes["port_file"] = args.port_file
    if args.log_level is not None:
        changes["log_level"] = args.log_level
    if args.log_format is not None:
        changes["log_format"] = args.log_format
    if changes:
        cfg = replace(cfg, gateway=replace(cfg.gateway, **changes))
    gw = cfg.gateway
    if gw.log_level.upper() not in LOG_LEVELS:
        raise ConfigError(f"gateway.log_level: must be one of {', '.join(LOG_LEVELS)}, got {gw.log_level!r}")
    if gw.loopback_only and not _is_loopback(gw.host):
        raise ConfigError(f"gateway.host: {gw.host!r} is not a loopback address and loopback_only is set")
    if gw.grpc_port and importlib.util.find_spec("grpc") is None:
        raise ConfigError("gateway.grpc_port: the gRPC endpoint needs grpcio: pip install 'easkit[grpc]'")
    for key in ("worker_host", "worker_advertise_host", "advertise_host"):
        value = getattr(gw, key)
        if gw.loopback_only and value is not None and not _is_loopback(value):
            raise ConfigError(f"gateway.{key}: {value!r} is not a loopback address and loopback_only is set")
    return cfg


def write_port_file(path: str, host: str, port: int) -> None:
    """Write ``host:port`` atomically (readers never see a partial file)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".port-", dir=str(target.parent))
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(f"{host}:{port}\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def serve(cfg: Config) -> int:
    from aiohttp import web

    from gateway.app import create_app
    from gateway.server import GatewayRunner, bound_port
    from gateway.state import POOLS_KEY, QUEUES_KEY, STATE_KEY

    gw = cfg.gateway
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    again = asyncio.Event()  # a second signal: skip the drain delay

    def on_signal(signame: str) -> None:
        if stop.is_set():
            log.warning("%s received again; already stopping (drain delay cut short)", signame)
            again.set()
            return
        log.info("%s received: stopping (in-flight requests get up to %g s)", signame, gw.shutdown_timeout_s)
        app[STATE_KEY].shutting_down = True  # /readyz turns 503 at once
        stop.set()

    app = create_app(cfg, cluster_serving=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)
    runner = GatewayRunner(app)
    try:
        await runner.setup()  # starts worker pools and queues (cleanup context)
    except Exception as exc:
        log.error("start-up failed: %s", exc)
        with contextlib.suppress(Exception):
            await runner.cleanup()
        return 1
    try:
        site: web.BaseSite
        if gw.predict_fast_path or (gw.queue_fast_path and app[QUEUES_KEY] is not None):
            from gateway.fast_front import FastSite

            site = FastSite(runner, gw.host, gw.port, conns=runner.fast_conns, backlog=1024)
        else:
            site = web.TCPSite(runner, gw.host, gw.port, backlog=1024)
        try:
            await site.start()
        except OSError as exc:
            log.error("cannot listen on %s:%s: %s", gw.host, gw.port, exc.strerror or exc)
            return 1
        port = bound_port(runner)
        if hasattr(app[QUEUES_KEY], "advertise"):  # where gateways sharing a Redis forward to
            app[QUEUES_KEY].advertise(gw.advertise_host or gw.host, port)
        url = f"http://{_url_host(gw.host)}:{port}"
        log.info(
            "listening on %s (%d service(s), event loop %s)", url, len(cfg.services), type(loop).__module__
        )
        for warning in open_service_warnings(cfg):
            log.warning("%s", warning)

        pools = list(app[POOLS_KEY].items())
        ready_task = asyncio.gather(
            *(p.wait_ready(gw.worker_start_timeout_s) for _, p in pools), return_exceptions=True
        )
        stop_task = asyncio.create_task(stop.wait())
        await asyncio.wait({ready_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if ready_task.done() and not stop.is_set():
            results = ready_task.result()
            for (name, _), ok in zip(pools, results, strict=True):
                if ok is not True:
                    log.warning("service %s has no ready worker after %g s", name, gw.worker_start_timeout_s)
            print(f"gateway listening on {url}", flush=True)
            if gw.port_file:
                write_port_file(gw.port_file, gw.host, port)
            log.info("ready")
        else:
            ready_task.cancel()
        await stop_task
        if gw.drain_delay_s > 0:
            # Still serving, /readyz already 503: load balancers move traffic away first.
            log.info("draining for %g s before closing the listener", gw.drain_delay_s)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(again.wait(), gw.drain_delay_s)
    finally:
        app[STATE_KEY].shutting_down = True
        # Closes the listener, lets in-flight requests finish, then stops pools/queues.
        await runner.cleanup()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    log.info("stopped")
    return 0


def _run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:  # optional: plain asyncio works too
        return asyncio.run(coro)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return uvloop.run(coro)  # pragma: no cover - python 3.10


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = build_config(args)
    except ConfigError as exc:
        print(f"eas-gateway: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from gateway.logging import setup_logging

    setup_logging(cfg.gateway.log_level, cfg.gateway.log_format)
    try:
        return _run(serve(cfg))
    except ConfigError as exc:  # raised while building pools/queues
        print(f"eas-gateway: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
