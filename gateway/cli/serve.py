"""``eas-gateway serve --config services.yaml`` (also ``python -m gateway serve ...``).

Start-up: load and validate the config (errors name the field, exit 2); check that every
listener's port is free (a taken one: exit 1, naming it and its setting, no worker
started); start the worker pools, bind, log the address; wait until they are ready (at most
``worker_start_timeout_s``), then print ``gateway listening on http://H:P`` on stdout and
write ``H:P`` to ``--port-file`` atomically. A service that is not ready then is a warning
with its reason, except with ``--model``/``--model-repository``: the load error, exit 1.

SIGHUP (or ``POST /admin/reload``) re-reads the config file and applies its services as
the admin API would: added ones start, changed ones roll, removed ones drain and stop.
Services changed through the admin API (kept in ``data_dir``) stay on top of the file.

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
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

from gateway.config import Config, ConfigError, is_loopback, load_config, open_service_warnings
from gateway.config.ports import port_clashes
from gateway.config.values import ConfigErrors

log = logging.getLogger("gateway")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def build_config(args: argparse.Namespace) -> Config:
    if args.config:
        if args.name or args.workers is not None or args.token or args.poll is not None:
            raise ConfigError("--name, --workers, --token and --poll go with --model or --model-repository")
        cfg = load_config(args.config)
    elif args.paddle_config:
        if args.workers is not None or args.token or args.poll is not None:
            raise ConfigError("--workers, --token and --poll go with --model or --model-repository")
        from gateway.cli.paddle_config import paddle_config

        cfg = paddle_config(args)
    else:
        from gateway.cli.quick import quick_config

        if args.poll is not None and (not args.model_repository or args.poll <= 0):
            raise ConfigError("--poll: a number of seconds above 0, with --model-repository")
        cfg = quick_config(args)
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
        flags = {"gateway.port": "--port", "gateway.grpc_port": "--grpc-port"}
        named = {key: f"{flag} (over {key})" for key, flag in flags.items() if key.split(".")[1] in changes}
        clashes = port_clashes(cfg.gateway, cfg.admin, named)
        if clashes:
            raise ConfigErrors(clashes)
    gw = cfg.gateway
    if gw.log_level.upper() not in LOG_LEVELS:
        raise ConfigError(f"gateway.log_level: must be one of {', '.join(LOG_LEVELS)}, got {gw.log_level!r}")
    if gw.loopback_only and not is_loopback(gw.host):
        raise ConfigError(f"gateway.host: {gw.host!r} is not a loopback address and loopback_only is set")
    if gw.grpc_port and importlib.util.find_spec("grpc") is None:
        raise ConfigError("gateway.grpc_port: the gRPC endpoint needs grpcio: pip install 'easkit[grpc]'")
    for key in ("worker_host", "worker_advertise_host", "advertise_host"):
        value = getattr(gw, key)
        if gw.loopback_only and value is not None and not is_loopback(value):
            raise ConfigError(f"gateway.{key}: {value!r} is not a loopback address and loopback_only is set")
    if gw.loopback_only and cfg.admin is not None and not is_loopback(cfg.admin.host):
        raise ConfigError(
            f"admin.host: {cfg.admin.host!r} is not a loopback address and loopback_only is set"
        )
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


async def serve(cfg: Config, quick: argparse.Namespace | None = None) -> int:
    """Run until SIGTERM/SIGINT. ``quick``: the arguments of ``--model`` or
    ``--model-repository`` (how to call the services is printed once ready)."""
    from aiohttp import web

    from gateway.app import create_app
    from gateway.cli.listeners import first_unavailable, listeners
    from gateway.core.backend import ServiceBackend
    from gateway.core.heap import freeze_startup_heap
    from gateway.fronts.admin.api import admin_url, start_admin
    from gateway.fronts.server import GatewayRunner, bound_port
    from gateway.fronts.state import GATEWAY_KEY
    from gateway.manage.store import ManagedStore
    from gateway.queue.datadir import StoreUnusable

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
        app[GATEWAY_KEY].state.shutting_down = True  # /readyz turns 503 at once
        stop.set()

    # Services changed through the admin API (data_dir) on top of the config file's.
    store = ManagedStore(gw.data_dir)
    try:
        store.load()
    except ConfigError as exc:
        log.error("start-up failed: %s", exc)
        return 1
    cfg = replace(cfg, services=store.apply(cfg.services))
    try:
        app = create_app(cfg, cluster_serving=True, managed_store=store)
        parts = app[GATEWAY_KEY]
    except StoreUnusable as exc:  # locked by another gateway, missing, corrupt, unwritable
        log.error("start-up failed: %s", exc)
        return 1
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)
    if cfg.source is not None:
        parts.state.reload = reloader(app, cfg)
    elif quick is not None and quick.model_repository:
        from gateway.cli.quick import repository_reloader

        parts.state.reload = repository_reloader(app, quick.model_repository, quick)
    # Never the default action (which ends the process, mid-request).
    loop.add_signal_handler(signal.SIGHUP, on_sighup, app)
    poller: asyncio.Task[None] | None = None
    # Every listener's port is checked before a worker starts: a taken port is one line
    # naming it and the setting to change, with no workers started only to be stopped.
    unavailable = first_unavailable(cfg)
    if unavailable is not None:
        log.error("start-up failed: %s", unavailable)
        return 1
    named = {listener.what: listener for listener in listeners(cfg)}
    runner = GatewayRunner(app)
    admin_runner: web.AppRunner | None = None
    try:
        await runner.setup()  # starts worker pools and queues, and gRPC (cleanup context)
    except Exception as exc:
        grpc = named.get("V2 gRPC endpoint")
        failed = grpc.failed(exc) if isinstance(exc, OSError) and grpc is not None else exc
        log.error("start-up failed: %s", failed)
        with contextlib.suppress(Exception):
            await runner.cleanup()
        return 1
    tls = None
    if gw.tls is not None:  # HTTPS on the HTTP port: one context for the listener's life
        from gateway.core.tls import ServerTls, TlsError

        try:
            server_tls = ServerTls(gw.tls)
        except TlsError as exc:
            log.error("start-up failed: gateway.tls: %s", exc)
            await runner.cleanup()
            return 1
        tls = server_tls.context
        parts.state.tls_reloads.append(server_tls.reload)
    if gw.worker_tls is not None:  # the link to remote workers: new connections after SIGHUP
        from gateway.core.tls import TlsError, worker_link

        try:
            parts.state.tls_reloads.append(worker_link(gw.worker_tls).reload)
        except TlsError as exc:
            log.error("start-up failed: gateway.worker_tls: %s", exc)
            await runner.cleanup()
            return 1
    try:
        site: web.BaseSite
        if gw.predict_fast_path or (gw.queue_fast_path and parts.queues is not None):
            from gateway.fronts.fast_front import FastSite

            site = FastSite(runner, gw.host, gw.port, conns=runner.fast_conns, backlog=1024, ssl_context=tls)
        else:
            site = web.TCPSite(runner, gw.host, gw.port, backlog=1024, ssl_context=tls)
        try:
            await site.start()
        except OSError as exc:
            log.error("start-up failed: %s", named["HTTP endpoint"].failed(exc))
            return 1
        if cfg.admin is not None:
            from gateway.fronts.routes.status import SAMPLER_KEY

            try:
                admin_runner = await start_admin(app, app[SAMPLER_KEY].snapshot, tls)
            except OSError as exc:
                log.error("start-up failed: %s", named["admin API"].failed(exc))
                return 1
        port = bound_port(runner)
        qm = parts.queues
        if qm is not None:  # where gateways sharing a Redis forward to
            qm.advertise(gw.advertise_host or gw.host, port)
        url = f"{'https' if gw.tls else 'http'}://{_url_host(gw.host)}:{port}"
        log.info(
            "listening on %s (%d service(s), event loop %s); starting the services",
            url, len(cfg.services), type(loop).__module__,
        )  # fmt: skip
        if admin_runner is not None:
            print(f"admin API listening on {admin_url(admin_runner, tls is not None)}", flush=True)
        for warning in open_service_warnings(cfg):
            log.warning("%s", warning)

        backends = list(parts.backends.items())
        waited_from = time.monotonic()

        async def wait_ready(backend: ServiceBackend) -> tuple[bool, float]:
            ok = await backend.wait_ready(gw.worker_start_timeout_s)
            return ok is True, time.monotonic() - waited_from

        ready_task = asyncio.gather(*(wait_ready(b) for _, b in backends), return_exceptions=True)
        stop_task = asyncio.create_task(stop.wait())
        await asyncio.wait({ready_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if ready_task.done() and not stop.is_set():
            not_ready = []
            for (name, backend), result in zip(backends, ready_task.result(), strict=True):
                if isinstance(result, BaseException) or not result[0]:
                    took = result[1] if isinstance(result, tuple) else time.monotonic() - waited_from
                    reason = backend.not_ready_reason() or "it has no ready worker"
                    not_ready.append((name, took, reason))
            if quick is not None and not_ready:
                # A model named on the command line that does not load is the whole answer:
                # say why and stop, as Triton does for a model that fails at start.
                for name, _, reason in not_ready:
                    log.error("start-up failed: service %s cannot serve: %s", name, reason)
                stop_task.cancel()
                await asyncio.gather(stop_task, return_exceptions=True)
                return 1
            for name, took, reason in not_ready:
                log.warning("service %s is not ready after %.1f s: %s", name, took, reason)
            freeze_startup_heap()
            print(f"gateway listening on {url}", flush=True)
            if quick is not None:
                from gateway.cli.quick import poll_repository, usage

                metadata = {n: b.metadata for n, b in parts.backends.items()}
                print(usage(url, parts.config, metadata), flush=True)
                if quick.poll:
                    poller = asyncio.create_task(poll_repository(app, quick.poll))
            if gw.port_file:
                write_port_file(gw.port_file, gw.host, port)
            if not_ready:
                names = ", ".join(name for name, _, _ in not_ready)
                log.warning("serving, but not ready: %s (503 until a worker is ready; why: above)", names)
            else:
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
        parts.state.shutting_down = True
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        if admin_runner is not None:
            await admin_runner.cleanup()
        # Closes the listener, lets in-flight requests finish, then stops pools/queues.
        await runner.cleanup()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
    log.info("stopped")
    return 0


def reloader(app: Any, cfg: Config) -> Callable[[], Awaitable[dict[str, Any]]]:
    """Re-read the config file and apply its services through the service manager. Settings
    outside ``services:`` take effect at the next start (logged when they changed)."""
    from gateway.fronts.state import GATEWAY_KEY

    lock = asyncio.Lock()

    async def reload() -> dict[str, Any]:
        async with lock:
            t0 = time.monotonic()
            try:
                new = load_config(cfg.source or "")
            except ConfigError as exc:
                # What SIGHUP logs and POST /admin/reload answers (400), word for word.
                raise ConfigError(f"reload refused, the running services stay: {exc}") from None
            done = await app[GATEWAY_KEY].manager.reload(new)
            took = time.monotonic() - t0
            log.info(
                "config reloaded in %.1f s: added %s, changed %s, removed %s%s",
                took,
                ", ".join(done["added"]) or "none",
                ", ".join(done["changed"]) or "none",
                ", ".join(done["removed"]) or "none",
                f"; not applied: {', '.join(done['failed'])}" if done["failed"] else "",
            )
            return done

    return reload


def on_sighup(app: Any) -> None:
    from gateway.core.tls import TlsError
    from gateway.fronts.state import GATEWAY_KEY

    for reload_tls in app[GATEWAY_KEY].state.tls_reloads:
        try:
            reload_tls()
        except TlsError as exc:  # the listener keeps the certificate it has
            log.error("SIGHUP: %s; the previous certificate stays in use", exc)
    reload = app[GATEWAY_KEY].state.reload
    if reload is None:
        log.info("SIGHUP received: nothing to reload (no config file or model repository)")
        return

    async def run() -> None:
        log.info("SIGHUP received: reloading the config file")
        try:
            await reload()
        except ConfigError as exc:
            log.error("%s", exc)
        except Exception:
            log.exception("reload failed")

    task = asyncio.ensure_future(run())
    _RELOADS.add(task)
    task.add_done_callback(_RELOADS.discard)


_RELOADS: set[asyncio.Future[None]] = set()


def _run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:  # optional: plain asyncio works too
        return asyncio.run(coro)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return uvloop.run(coro)  # pragma: no cover - python 3.10
