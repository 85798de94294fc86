"""``eas-gateway worker``: serve one service's model on this host for gateways elsewhere."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gateway.cli.serve import LOG_LEVELS
from gateway.worker.scheduling import POLICIES

TOKEN_ENV = "EAS_WORKER_TOKEN"  # noqa: S105 - the name of a variable, not a secret


def add_parser(sub: Any) -> None:
    w = sub.add_parser(
        "worker",
        help="run a remote worker that joins a gateway's service",
        description=(
            "Serve one service's model on this host and join the pools of the gateways at --gateway "
            "(every address its host name resolves to). The service must allow remote workers "
            "(remote_workers: {token: ...} in its config)."
        ),
    )
    w.add_argument("--gateway", required=True, help="a gateway's URL, e.g. http://gateway:8080")
    w.add_argument("--service", required=True, help="the service to serve")
    w.add_argument(
        "--token",
        help=f"the service's remote_workers.token (default: ${TOKEN_ENV}; prefer the variable, "
        "a command line is visible to every user of the host)",
    )
    w.add_argument("--model", help="the model file on this host (default: the service's own path)")
    w.add_argument("--entry", help="a python processor's 'file.py:Class' on this host")
    w.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    w.add_argument("--port", type=int, default=0, help="the RPC port gateways connect to (default: any free)")
    w.add_argument("--advertise", help="the address gateways and direct clients reach this worker at")
    w.add_argument("--heartbeat", type=float, help="seconds between registrations (default: ttl_s / 3)")
    w.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO")
    w.add_argument(
        "--tls-cert",
        help="this worker's certificate (PEM): with --tls-key and --tls-ca, gateways reach it over "
        "mutual TLS and it registers with them over HTTPS presenting it (gateway.worker_tls); "
        "SIGHUP loads the three files again",
    )
    w.add_argument("--tls-key", help="the private key of --tls-cert")
    w.add_argument("--tls-ca", help="the CA bundle the gateways' certificates must chain to")
    w.add_argument(
        "--model-cache-dir",
        help="where a model named by a URL (s3://, oss://, https://) is downloaded to "
        "(default ~/.cache/easkit/models); the store and its credentials come from the environment",
    )
    w.add_argument(
        "--scheduling",
        choices=POLICIES,
        default="batch",
        help="the kernel's scheduling policy for this worker (default batch, as the gateway's "
        "own workers: gateway.worker_scheduling)",
    )


def run(args: argparse.Namespace) -> int:
    from gateway.core.logs import setup_logging
    from gateway.worker import scheduling
    from gateway.worker.agent import AgentOptions
    from gateway.worker.agent import run as run_agent

    token = args.token or os.environ.get(TOKEN_ENV, "")
    if not token:
        print(f"eas-gateway worker: --token or ${TOKEN_ENV} is required", file=sys.stderr)
        return 2
    setup_logging(args.log_level, "text")
    scheduling.apply(args.scheduling)  # before the event loop and the compute thread start
    opts = AgentOptions(
        gateway=args.gateway,
        service=args.service,
        token=token,
        model=args.model,
        entry=args.entry,
        host=args.host,
        port=args.port,
        advertise=args.advertise,
        heartbeat_s=args.heartbeat,
        log_level=args.log_level,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        **({"cache_dir": args.model_cache_dir} if args.model_cache_dir else {}),
    )
    if len({opts.tls_cert is None, opts.tls_key is None, opts.tls_ca is None}) > 1:
        print("eas-gateway worker: --tls-cert, --tls-key and --tls-ca go together", file=sys.stderr)
        return 2
    return run_agent(opts)


__all__ = ["TOKEN_ENV", "add_parser", "run"]
