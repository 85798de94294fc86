"""``eas-gateway``: run the gateway and operate it.

* ``serve --config FILE`` runs it (gateway.cli.serve);
* ``services list|get|create|update|scale|delete`` talk to a running gateway's admin API,
  ``status`` to its main port or admin API (gateway.cli.services);
* ``queues groups|delete-group`` lists and deletes a queue service's consumer groups
  through the admin API (gateway.cli.queues);
* ``validate FILE`` checks a config file and lists every error (gateway.cli.validate);
* ``worker --gateway URL --service NAME`` serves a service's model on this host for the
  gateways there (gateway.cli.worker).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gateway import __version__
from gateway.cli.serve import LOG_LEVELS, build_config, write_port_file
from gateway.config import ConfigError

EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    from gateway.cli import services

    p = argparse.ArgumentParser(prog="eas-gateway", description="EAS-compatible inference gateway")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the gateway")
    what = s.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", "-c", help="services YAML file")
    what.add_argument(
        "--model",
        "-m",
        action="append",
        help="serve this model file (repeat for several): .onnx; .joblib/.pkl sklearn, "
        ".json/.ubj xgboost, .txt lightgbm",
    )
    what.add_argument("--model-repository", help="serve every model in this folder (Triton layout)")
    what.add_argument(
        "--paddle-config", help="serve the pipeline of Paddle Serving's config.yml (ONNX models in its place)"
    )
    s.add_argument(
        "--name",
        action="append",
        help="service name of the --model at the same place (or of the Paddle pipeline)",
    )
    s.add_argument("--workers", type=int, help="workers per service (--model, --model-repository)")
    s.add_argument("--token", help="token every service asks for (--model, --model-repository)")
    s.add_argument("--poll", type=float, help="rescan the --model-repository every SECONDS")
    s.add_argument("--host", help="listen address (overrides gateway.host)")
    s.add_argument("--port", type=int, help="listen port, 0 picks a free one (overrides gateway.port)")
    s.add_argument("--grpc-port", type=int, help="V2 gRPC port, 0 for none (overrides gateway.grpc_port)")
    s.add_argument("--port-file", help="write 'host:port' here once ready (overrides gateway.port_file)")
    s.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, help="overrides gateway.log_level")
    s.add_argument("--log-format", choices=("text", "json"), help="overrides gateway.log_format")
    v = sub.add_parser("validate", help="check a config file; list every error with its place")
    v.add_argument("config", help="services YAML file")
    services.add_parsers(sub)
    from gateway.cli import queues

    queues.add_parsers(sub)
    from gateway.cli import worker

    worker.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "validate":
        from gateway.cli.validate import validate

        return validate(args.config)
    if args.command == "worker":
        from gateway.cli.worker import run as run_worker

        return run_worker(args)
    if args.command == "queues":
        from gateway.cli.queues import run as run_queues

        return run_queues(args)
    if args.command in ("services", "status"):
        from gateway.cli.services import run

        return run(args)
    try:
        cfg = build_config(args)
    except ConfigError as exc:
        print(f"eas-gateway: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from gateway.cli.serve import _run, serve
    from gateway.core.logs import setup_logging

    setup_logging(cfg.gateway.log_level, cfg.gateway.log_format)
    try:
        return _run(serve(cfg, None if args.config or args.paddle_config else args))
    except ConfigError as exc:  # raised while building pools/queues
        print(f"eas-gateway: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG


__all__ = ["EXIT_CONFIG", "build_config", "main", "write_port_file"]
