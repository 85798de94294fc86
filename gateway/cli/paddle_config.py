"""``eas-gateway serve --paddle-config config.yml``: Paddle Serving's pipeline file as services.

Paddle's ``config.yml`` becomes one ``onnx`` service per op (its ``local_service_conf``'s
model, an ONNX file in place of Paddle's model folder) and one ``pipeline`` service (named by
``--name``, Paddle's ``WebService(name=...)``; default ``pipeline``) whose steps are the ops in
the file's order, each feeding the next, on Paddle's ``rpc_port`` and ``http_port``.

Paddle defines the op classes in its program (``UciOp(name="uci")``); here an op names its
class with ``op_class: web_service.py:UciOp`` (a Paddle ``Op`` class, run as it is:
gateway/worker/paddle_ops.py). An op without one feeds its inputs to its model, as Paddle's
default ``Op`` does. An op's inputs are its model's inputs (or its ``request_keys:``, the
request's keys its class reads, where they differ), each an earlier op's output of the same
name, else the request's.

Every key is honoured or refused by name (:data:`KEYS` says which and how); a refused key or
value is a ConfigError naming it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gateway.config import Config, ConfigError, parse_config

# Keys read, by where they are; anything else is refused by name.
TOP_KEYS = ("rpc_port", "http_port", "worker_num", "build_dag_each_worker", "dag", "op")
DAG_KEYS = ("is_thread_op", "retry", "use_profile")
OP_KEYS = ("concurrency", "timeout", "retry", "batch_size", "local_service_conf", "op_class", "request_keys")
LOCAL_KEYS = ("model_config", "fetch_list", "client_type", "device_type", "devices", "thread_num", "ir_optim",
              "mem_optim")  # fmt: skip
# Settings accepted only at the value that needs nothing of the gateway (Paddle's defaults).
_ONLY = {
    "dag.retry": (1,),  # one attempt: a step is not retried
    "dag.use_profile": (False,),  # per-step timings: the X-Eas-Pipeline-Timings header instead
    "retry": (1,),
    "batch_size": (1,),  # batching is a service's ``batching:``
    "client_type": ("local_predictor",),  # the model runs in the gateway's workers
    "device_type": (0, "cpu"),
    "devices": ("",),
}


def _refuse(where: str, given: Mapping[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(map(str, given)) - set(known))
    if unknown:
        raise ConfigError(f"{where}: {', '.join(unknown)} not supported here (known: {', '.join(known)})")


def _only(key: str, where: str, value: Any) -> None:
    allowed = _ONLY[key]
    if value not in allowed:
        shown = " or ".join(repr(v) for v in allowed)
        raise ConfigError(f"{where}: {value!r} is not supported; only {shown}")


def _int(value: Any, where: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(f"{where}: expected an integer of at least {lo}, got {value!r}")
    return value


def _onnx_file(value: Any, base: Path, where: str) -> Path:
    """Paddle's model folder -> the ONNX file in its place (the file, or a folder holding one)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected the path of an ONNX model (or a folder holding one)")
    path = Path(value) if Path(value).is_absolute() else base / value
    if path.is_dir():
        found = sorted(path.glob("*.onnx"))
        if len(found) != 1:
            raise ConfigError(f"{where}: {value!r} holds {len(found)} .onnx files; export the model once")
        return found[0]
    if path.suffix != ".onnx" or not path.is_file():
        raise ConfigError(f"{where}: {value!r} is not an ONNX file (paddle2onnx --save_file model.onnx)")
    return path


def _model_inputs(path: Path) -> list[str]:
    """The model's input names, as ONNX Runtime reads them (the gateway's one ONNX reader)."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # ONNX Runtime's own error types
        raise ConfigError(f"{path}: cannot load the ONNX model ({exc})") from None
    return [a.name for a in session.get_inputs()]


def translate(raw: Any, base: Path, name: str = "pipeline") -> dict[str, Any]:
    """Paddle's parsed ``config.yml`` -> the gateway's config document."""
    if not isinstance(raw, Mapping):
        raise ConfigError("expected Paddle's config.yml: a mapping with op, rpc_port, http_port, ...")
    _refuse("config.yml", raw, TOP_KEYS)
    dag = raw.get("dag") or {}
    if not isinstance(dag, Mapping):
        raise ConfigError("dag: expected a mapping")
    _refuse("dag", dag, DAG_KEYS)
    for key in ("retry", "use_profile"):
        if key in dag:
            _only(f"dag.{key}", f"dag.{key}", dag[key])
    thread_ops = dag.get("is_thread_op", True)
    if not isinstance(thread_ops, bool):
        raise ConfigError(f"dag.is_thread_op: expected true or false, got {thread_ops!r}")
    each_worker = raw.get("build_dag_each_worker", False)
    if not isinstance(each_worker, bool):
        raise ConfigError(f"build_dag_each_worker: expected true or false, got {each_worker!r}")
    worker_num = _int(raw.get("worker_num", 1), "worker_num", 1)
    ops = raw.get("op")
    if not isinstance(ops, Mapping) or not ops:
        raise ConfigError("op: expected the ops by name, each with its local_service_conf")
    services: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    request_inputs: list[str] = []
    previous: dict[str, str] = {}  # output name -> its step
    for op_name, conf in ops.items():
        where = f"op.{op_name}"
        if not isinstance(conf, Mapping):
            raise ConfigError(f"{where}: expected a mapping")
        _refuse(where, conf, OP_KEYS)
        for key in ("retry", "batch_size"):
            if key in conf:
                _only(key, f"{where}.{key}", conf[key])
        concurrency = _int(conf.get("concurrency", 1), f"{where}.concurrency", 1)
        local = conf.get("local_service_conf")
        if not isinstance(local, Mapping):
            raise ConfigError(f"{where}.local_service_conf: required, with model_config and fetch_list")
        _refuse(f"{where}.local_service_conf", local, LOCAL_KEYS)
        for key in ("client_type", "device_type", "devices"):
            if key in local:
                _only(key, f"{where}.local_service_conf.{key}", local[key])
        for key in ("ir_optim", "mem_optim"):  # ONNX Runtime optimises the graph either way
            if not isinstance(local.get(key, False), bool):
                raise ConfigError(f"{where}.local_service_conf.{key}: expected true or false")
        model = _onnx_file(local.get("model_config"), base, f"{where}.local_service_conf.model_config")
        fetch = local.get("fetch_list")
        if not isinstance(fetch, list) or not fetch or not all(isinstance(f, str) for f in fetch):
            raise ConfigError(f"{where}.local_service_conf.fetch_list: expected the names of the outputs")
        service: dict[str, Any] = {
            "name": f"{name}-{op_name}",
            "processor": "onnx",
            "model": str(model),
            "public": True,  # reached only through the pipeline, which Paddle left open too
            "workers": concurrency * (worker_num if each_worker else 1),
            "intra_op_threads": _int(local.get("thread_num", 1), f"{where}.local_service_conf.thread_num", 1),
        }
        if not thread_ops:  # Paddle's process ops: worker processes (else placement auto's threads)
            service["placement"] = "process"
        timeout = conf.get("timeout", -1)
        if _int(timeout, f"{where}.timeout", -1) > 0:
            service["timeout_ms"] = timeout
        services.append(service)
        keys = conf.get("request_keys")
        if keys is not None and (not isinstance(keys, list) or not all(isinstance(k, str) for k in keys)):
            raise ConfigError(f"{where}.request_keys: expected a list of the request's keys the op reads")
        inputs = list(keys) if keys else _model_inputs(model)
        request_inputs += [i for i in inputs if i not in previous and i not in request_inputs]
        step: dict[str, Any] = {
            "name": str(op_name),
            "service": service["name"],
            "concurrency": concurrency,
            "inputs": {i: f"{previous[i]}.{i}" if i in previous else f"request.{i}" for i in inputs},
            "outputs": list(fetch),
        }
        if conf.get("op_class") is not None:
            step["op"] = conf["op_class"]
        steps.append(step)
        previous.update({f: str(op_name) for f in fetch})
    pipeline_svc: dict[str, Any] = {
        "name": name,
        "processor": "pipeline",
        "public": True,  # as open as Paddle's server; give it a token in a services.yaml
        "pipeline": {
            "inputs": {i: {} for i in request_inputs},
            "steps": steps,
            "outputs": {f: f"{steps[-1]['name']}.{f}" for f in steps[-1]["outputs"]},
        },
    }
    rpc_port = raw.get("rpc_port")
    if rpc_port is not None:
        pipeline_svc["rpc_port"] = rpc_port
    gateway: dict[str, Any] = {}
    if raw.get("http_port") is not None:
        gateway["port"] = raw["http_port"]
    return {"gateway": gateway, "services": [*services, pipeline_svc]}


def paddle_config(args: argparse.Namespace) -> Config:
    path = Path(args.paddle_config)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--paddle-config: cannot read {path}: {exc}") from None
    names = args.name or []
    if len(names) > 1:
        raise ConfigError("--name: one name for the pipeline of a --paddle-config")
    doc = translate(raw, path.parent, names[0] if names else "pipeline")
    return parse_config(doc, source=str(path))


__all__ = ["paddle_config", "translate"]
