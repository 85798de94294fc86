"""Serving without a config file: ``serve --model PATH`` and ``serve --model-repository DIR``.

A ``--model`` file is served by the runtime its suffix names (gateway.config.catalog's
MODEL_SUFFIXES: ``.onnx``; ``.joblib``, ``.pkl``: sklearn; ``.json``, ``.ubj``: xgboost; ``.txt``:
lightgbm; ``.pt``: torch; ``.pmml``: pmml), a SavedModel folder by tensorflow.

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
import math
import shlex
from pathlib import Path
from typing import Any

from gateway.config import SERVICE_NAME_RE, Config, ConfigError, parse_config
from gateway.config.catalog import PICKLE_PROCESSORS
from gateway.config.model_urls import is_model_url, redact_url
from gateway.config.values import runtime_of
from gateway.core.metadata import UNKNOWN
from gateway.fronts.state import GATEWAY_KEY
from gateway.manage.repository import scan, scan_url

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
    if args.model_repository and is_model_url(args.model_repository):  # a bucket: s3://b/models/
        from gateway.sources.stores import StoreError

        try:  # its errors name no repository: the caller's message does
            return scan_url(args.model_repository, _defaults(args))
        except StoreError as exc:
            raise ConfigError(str(exc)) from None
    if args.model_repository:
        root = Path(args.model_repository)
        if not root.is_dir():
            raise ConfigError("not a folder")
        return scan(root, _defaults(args))
    names = args.name or []
    if len(names) > len(args.model):
        raise ConfigError("--name: given more often than --model")
    out = []
    for i, model in enumerate(args.model):
        name = names[i] if i < len(names) else Path(model).stem
        if not SERVICE_NAME_RE.fullmatch(name):
            raise ConfigError(f"--name: {name!r} is not a valid service name (use --name)")
        processor = runtime_of(model)
        out.append({**_defaults(args), "name": name, "processor": processor, "model": model})
    return out


def _gateway(args: argparse.Namespace, services: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``gateway:`` section the services need: the model folders a pickle may load from."""
    if args.model_repository:
        # The repository folder is the operator's choice: every model in it is theirs to load.
        local = not is_model_url(args.model_repository)
        return {"model_dirs": [str(Path(args.model_repository).resolve())]} if local else {}
    if any(s["processor"] in PICKLE_PROCESSORS for s in services):
        # A pickle loads only from model folders: the files named on the command line are
        # the operator's choice, so their folders are the ones allowed.
        local = (s["model"] for s in services if not is_model_url(s["model"]))
        return {"model_dirs": sorted({str(Path(m).resolve().parent) for m in local})}
    return {}


def quick_config(args: argparse.Namespace) -> Config:
    try:
        services = quick_services(args)
    except ConfigError as exc:
        if not args.model_repository:
            raise
        where = (
            redact_url(args.model_repository)
            if is_model_url(args.model_repository)
            else args.model_repository
        )
        raise ConfigError(f"--model-repository {where}: {exc}") from None
    return parse_config({"gateway": _gateway(args, services), "services": services})


# A zero tensor longer than this is made by a Python one-liner piped into curl, not written out.
INLINE_ELEMENTS = 256


def _zero(datatype: str) -> Any:
    if datatype == "BOOL":
        return False
    if datatype == "BYTES":
        return ""
    return 0.0 if datatype.startswith(("FP", "BF")) else 0


def _curl_infer(url: str, name: str, auth: str, inputs: list[Any]) -> str:
    """A curl call of the model with zeros of its inputs' shapes (any-size dimensions as 1),
    runnable as printed."""
    target = f"{url}/v2/models/{name}/infer"
    shapes = [(t, [max(d, 1) for d in t.shape]) for t in inputs]
    if max(math.prod(shape) for _, shape in shapes) <= INLINE_ELEMENTS:
        tensors = [
            {"name": t.name, "shape": shape, "datatype": t.datatype}
            | {"data": [_zero(t.datatype)] * math.prod(shape)}
            for t, shape in shapes
        ]
        return f"curl{auth} {target} -d {shlex.quote(json.dumps({'inputs': tensors}))}"
    # Too long to write out: the same body, made by Python.
    made = [
        f"dict(name={t.name!r}, shape={shape!r}, datatype={t.datatype!r}, "
        f"data=[{_zero(t.datatype)!r}] * {math.prod(shape)})"
        for t, shape in shapes
    ]
    script = f"import json; print(json.dumps(dict(inputs=[{', '.join(made)}])))"
    return f"python3 -c {shlex.quote(script)} | curl{auth} {target} -d @-"


def usage(url: str, cfg: Config, metadata: dict[str, Any]) -> str:
    """How to call each service, each line runnable as printed (a zero tensor of each input's
    shape): printed once the gateway is ready."""
    endpoint = url.removeprefix("http://")
    lines = []
    for svc in cfg.services:
        meta = metadata.get(svc.name)
        inputs = [] if meta is None else list(meta.inputs)
        auth = ' -H "Authorization: $EAS_TOKEN"' if svc.tokens else ""
        token = "; client.set_token(os.environ['EAS_TOKEN'])" if svc.tokens else ""
        imports = "import os; " if svc.tokens else ""
        lines += [
            f"service {svc.name}: {svc.model}",
            f"  python (this SDK; eas-prediction the same, from eas_prediction): {imports}"
            f"from eas_sdk import PredictClient; client = PredictClient({endpoint!r}, {svc.name!r}){token}; "
            "client.init()",
        ]
        # A model that does not say its inputs' types and shapes (TorchScript, undeclared) gets
        # no zero tensor to send: its metadata line says what is known.
        if inputs and all(t.datatype != UNKNOWN for t in inputs):
            lines.append(f"  curl (KServe V2): {_curl_infer(url, svc.name, auth, inputs)}")
        lines.append(f"  metadata: curl{auth} {url}/v2/models/{svc.name}")
    return "\n".join(lines)


async def poll_repository(app: Any, every: float) -> None:
    """Scan the repository every ``every`` seconds and apply what changed."""
    reload = app[GATEWAY_KEY].state.reload
    while True:
        await asyncio.sleep(every)
        try:
            await reload()
        except ConfigError as exc:
            log.error("%s", exc)  # the next scan may find the repository right
        except Exception:
            log.exception("model repository scan failed")


def repository_reloader(app: Any, root: Path | str, args: argparse.Namespace) -> Any:
    last: list[Any] = []
    root = redact_url(str(root)) if is_model_url(str(root)) else root

    async def reload() -> dict[str, Any]:
        try:
            services = quick_services(args)
            new = parse_config({"gateway": _gateway(args, services), "services": services})
        except ConfigError as exc:  # logged by SIGHUP's handler or the poller, answered by the admin API
            raise ConfigError(f"model repository {root}: {exc}") from None
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
