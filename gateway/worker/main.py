"""Worker process entry: ``python -m gateway.worker.main <fd>``.

Started by the pool as a fresh interpreter (spawn semantics), where ``fd`` is one end of
a socketpair. The pool sends ``(ServiceConfig, GatewayConfig, index, socket_path)`` over
it; the worker then serves (gateway.worker.serve) until SIGTERM or the gateway goes
away. The worker's own exit is EOF for the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from typing import Any

from gateway.config import GatewayConfig, ServiceConfig
from gateway.worker import scheduling
from gateway.worker.logs import setup_worker_logging
from gateway.worker.serve import serve

log = logging.getLogger("gateway.worker")


def run_worker(
    service: ServiceConfig, gateway: GatewayConfig, index: int, socket_path: str, conn: Any, loud: bool = True
) -> None:
    """Serve one worker until SIGTERM or the gateway goes away; never returns."""
    os.environ.update(service.env)
    # The event loop and the compute thread share the GIL: a shorter switch interval than
    # the default 5 ms keeps one from stalling the other (about +10% req/s measured).
    sys.setswitchinterval(0.0005)
    # Before any thread starts: the compute thread and the runtime's threads inherit it.
    scheduling.apply(gateway.worker_scheduling)
    setup_worker_logging(service.name, index, gateway.log_level, gateway.log_format)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    code = 1
    try:
        main = serve(service, gateway, socket_path, conn, gateway.shutdown_timeout_s, loud=loud)
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is optional
            code = asyncio.run(main)
        else:
            code = uvloop.run(main)
    except BaseException:
        log.exception("service %s: worker %d failed", service.name, index)
        code = 1
    finally:
        with contextlib.suppress(OSError):
            os.unlink(socket_path)
        # Skip interpreter teardown: daemon compute threads may be inside native code.
        logging.shutdown()
        os._exit(code)


def main(argv: list[str] | None = None) -> None:
    from multiprocessing.connection import Connection

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        sys.exit("usage: python -m gateway.worker.main <fd>  (started by the gateway's worker pool)")
    fd = int(args[0])
    os.set_inheritable(fd, False)  # processes the user's code starts must not hold it
    conn = Connection(fd)
    try:
        service, gateway, index, socket_path, *rest = conn.recv()
    except (EOFError, OSError):
        sys.exit(2)
    run_worker(service, gateway, index, socket_path, conn, loud=bool(rest[0]) if rest else True)


if __name__ == "__main__":
    main()
