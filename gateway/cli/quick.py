"""Serving without a config file: ``serve --model PATH.onnx`` and ``serve --model-repository DIR``.

The services are built here as ``services:`` entries and validated like a config file's;
once the gateway is ready, how to call each one is printed (this SDK or ``eas-prediction``,
curl on KServe V2). A repository given ``--poll SECONDS`` is scanned again that often (and
on SIGHUP): new models are loaded, changed ones rolled, removed ones unloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from gateway.config import SERVICE_NAME_RE, Config, ConfigError, parse_config
from gateway.fronts.state import GATEWAY_KEY
from gateway.manage.repository import scan

log = logging.getLogger("gateway")


def _defaults(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.workers is not None:
        out["workers"] = args.workers
    if args.token:
        out["token"] = args.token
    else:
        # No --token on the command line: the models are served open, as asked for; the
        # gateway warns at start when it listens beyond loopback.
        out["public"] = True
    return out


def quick_services(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The ``services:`` entries that ``--model`` or ``--model-repository`` stand for."""
    if args.model_repository:
        root = Path(args.model_repository)
        if not root.is_dir():
            raise ConfigError(f"--model-repository: not a folder: {root}")
        return scan(root, _defaults(args))
    names = args.name or []
    if len(names) > len(args.model):
        raise ConfigError("--name: given more often than --model")
    out = []
    for i, model in enumerate(args.model):
        name = names[i] if i < len(names) else Path(model).stem
        if not SERVICE_NAME_RE.fullmatch(name):
            raise ConfigError(f"--name: {name!r} is not a valid service name (use --name)")
        out.append({**_defaults(args), "name": name, "processor": "onnx", "model": model})
    return out


def quick_config(args: argparse.Namespace) -> Config:
    return parse_config({"services": quick_services(args)})


def usage(url: str, cfg: Config, metadata: dict[str, Any]) -> str:
    """How to call each service: printed once the gateway is ready."""
    endpoint = url.removeprefix("http://")
    lines = []
    for svc in cfg.services:
        meta = metadata.get(svc.name)
        inputs = [] if meta is None else list(meta.inputs)
        sample = [
            {"name": t.name, "shape": [max(d, 1) for d in t.shape], "datatype": t.datatype, "data": "..."}
            for t in inputs
        ]
        auth = ' -H "Authorization: $EAS_TOKEN"' if svc.tokens else ""
        token = "; client.set_token(os.environ['EAS_TOKEN'])" if svc.tokens else ""
        body = json.dumps({"inputs": sample})
        lines += [
            f"service {svc.name}: {svc.model}",
            "  python (this SDK or eas-prediction):"
            f" client = PredictClient({endpoint!r}, {svc.name!r}){token}; client.init()",
            f"  curl (KServe V2): curl{auth} {url}/v2/models/{svc.name}/infer -d '{body}'",
            f"  metadata: curl{auth} {url}/v2/models/{svc.name}",
        ]
    return "\n".join(lines)


async def poll_repository(app: Any, every: float) -> None:
    """Scan the repository every ``every`` seconds and apply what changed."""
    reload = app[GATEWAY_KEY].state.reload
    while True:
        await asyncio.sleep(every)
        try:
            await reload()
        except ConfigError:
            pass  # logged by the reloader; the next scan may find the repository right
        except Exception:
            log.exception("model repository scan failed")


def repository_reloader(app: Any, root: Path, args: argparse.Namespace) -> Any:
    last: list[Any] = []

    async def reload() -> dict[str, Any]:
        try:
            new = parse_config({"services": quick_services(args)})
        except ConfigError as exc:
            log.error("model repository %s: %s", root, exc)
            raise
        done: dict[str, Any] = await app[GATEWAY_KEY].manager.reload(new)
        changes = {k: v for k, v in done.items() if v}
        if changes and changes != (last[0] if last else None):
            log.info(
                "model repository %s: %s", root, ", ".join(f"{k} {', '.join(v)}" for k, v in changes.items())
            )
        last[:] = [changes]
        return done

    return reload


__all__ = ["poll_repository", "quick_config", "quick_services", "repository_reloader", "usage"]
