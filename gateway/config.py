"""Gateway configuration: one YAML file validated into frozen dataclasses.

Strings may reference environment variables as ``${NAME}`` (an unset variable
is an error naming the field). A few top-level settings can be overridden by
environment variables: EASGW_HOST, EASGW_PORT, EASGW_DATA_DIR, EASGW_LOG_LEVEL.
Relative file paths (model, entry file) are resolved against the working
directory first and then against the config file's directory; an onnx service's
``model`` and a python service's ``entry`` file (the ``path/to/file.py:Class`` form)
must exist.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

# Reading one value (and the error naming it) lives apart, so this module stays the schema.
from gateway.config_values import ConfigError
from gateway.config_values import bool_value as _bool
from gateway.config_values import expand as _expand
from gateway.config_values import float_value as _float
from gateway.config_values import int_value as _int
from gateway.config_values import open_service_warnings as open_service_warnings
from gateway.config_values import str_value as _str
from gateway.config_values import tokens_of as _tokens

SERVICE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
PROCESSORS = ("onnx", "python", "queue")
REQUEST_FORMATS = ("auto", "tf", "torch", "blade", "json")
# Listen addresses meaning "every interface": compared against, never bound here.
_EVERY_ADDRESS = ("0.0.0.0", "::")  # noqa: S104 - a value to recognise, not a bind


@dataclass(frozen=True)
class QueueConfig:
    max_length: int = 100_000
    max_payload_bytes: int = 8 * 1024 * 1024
    # "always": fsync every commit batch (survives power loss);
    # "normal": survives a gateway crash (kill -9), not power loss.
    fsync: str = "normal"
    max_window: int = 1024
    heartbeat_s: float = 5.0
    grace_s: float = 0.0
    # Where the queue's records live: "sqlite" (embedded, in data_dir) or a Redis URL
    # ("redis://host:port/db", "rediss://...", "unix:///path?db=0"), see docs/queue.md.
    backend: str = "sqlite"
    # Several gateways on one Redis: the one holding the store's lease serves its queues;
    # when it stops renewing (killed, cut off) another takes over after this long.
    owner_lease_s: float = 5.0


@dataclass(frozen=True)
class ClusterServingConfig:
    """A service that also serves Cluster Serving's own Redis stream (bigdl-serving's
    ``InputQueue``/``OutputQueue`` in Redis mode; docs/async-inference.md)."""

    redis: str = ""  # redis://host:port/db
    stream: str = "serving_stream"  # the clients' ``name``
    group: str = "serving"  # the consumer group every gateway reads the stream with
    max_batch: int = 32  # records read (and inferred) at once
    claim_idle_s: float = 30.0  # records a gone gateway read but never answered are taken after this


@dataclass(frozen=True)
class BatchingConfig:
    max_batch_size: int = 0  # 0: off
    max_latency_ms: float = 0.0


@dataclass(frozen=True)
class ServiceConfig:
    name: str
    processor: str
    token: str | None = None
    # Declared open: no token at all (``public: true``); a service without one is a config error.
    public: bool = False
    # Extra accepted tokens (rotation: add the next token here, then promote it).
    extra_tokens: tuple[str, ...] = ()
    model: str | None = None
    entry: str | None = None
    workers: int = 1
    max_pending: int = 64
    timeout_ms: int = 5000
    intra_op_threads: int = 1
    request_format: str = "auto"
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    # A worker whose compute thread has spent longer than this on one run while other
    # requests wait (a processor stuck in process()) reports unhealthy and is restarted (0: never).
    stall_timeout_s: float = 60.0
    # Asynchronous inference: an input queue at /api/predict/<name>, results at <name>/sink.
    async_: bool = False
    queue: QueueConfig = field(default_factory=QueueConfig)
    cluster_serving: ClusterServingConfig | None = None
    # Free-form settings handed to a python processor (processor.config).
    config: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    # onnx: (version, model file) ascending, ``model`` the latest's; empty: one version, "1".
    versions: tuple[tuple[str, str], ...] = ()

    @property
    def tokens(self) -> tuple[str, ...]:
        return ((self.token,) if self.token else ()) + self.extra_tokens

    @property
    def version_names(self) -> tuple[str, ...]:
        """The model versions served, ascending; the last is the latest (the default)."""
        return tuple(v for v, _ in self.versions) or ("1",)

    def __repr__(self) -> str:  # never show tokens
        return (
            f"ServiceConfig(name={self.name!r}, processor={self.processor!r}, workers={self.workers}, "
            f"token={'***' if self.tokens else None})"
        )


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    # Where to write "host:port" once listening (useful with port 0).
    port_file: str | None = None
    data_dir: str = "var/gateway"
    max_body_bytes: int = 16 * 1024 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 75.0
    shutdown_timeout_s: float = 10.0
    # After SIGTERM/SIGINT, keep serving this long with /readyz at 503 (so load balancers
    # stop sending) before the listener closes.
    drain_delay_s: float = 0.0
    worker_start_timeout_s: float = 60.0
    health_interval_s: float = 1.0
    access_log: bool = True
    # Plain queue calls / plain predict calls answered by the lean HTTP/1.1 front
    # (gateway/fast_front.py); everything else still goes to aiohttp on the same
    # connection. Both off: aiohttp serves all.
    queue_fast_path: bool = True
    predict_fast_path: bool = True
    log_level: str = "INFO"
    log_format: str = "text"
    discovery_requires_token: bool = False
    # Refuse non-loopback listen/upstream addresses (tests set EASGW_LOOPBACK_ONLY=1).
    loopback_only: bool = False
    # The service a bare Cluster Serving ``POST /predict`` goes to (default: the only one).
    cluster_serving_service: str | None = None
    # Gateway-wide admission (gateway/admission.py; 0 turns a limit off): open connections
    # (503 beyond), bytes of request bodies being received (429 beyond), of those the bytes of
    # calls not yet authenticated (an EAS signature needs the body; 429 beyond), calls in
    # flight per service (429 beyond).
    max_connections: int = 2048
    max_buffered_bytes: int = 256 * 1024 * 1024
    max_unverified_bytes: int = 64 * 1024 * 1024
    max_inflight_per_service: int = 1024
    # The largest answer a worker may give (413 ResponseTooLarge beyond; 0: no limit): an
    # answer's size can follow from a client-given shape.
    max_response_bytes: int = 64 * 1024 * 1024
    # The EAS signature: a Date within this many seconds of the gateway's clock (0: not
    # checked), Content-MD5 required with a body, the signed Content-Type the one sent, and an
    # optional cache of this many signatures seen (a replay within the window gets 401; 0: off).
    signature_max_skew_s: float = 900.0
    signature_require_md5: bool = True
    signature_bind_content_type: bool = True
    signature_replay_cache: int = 0
    # Pixels of all images in one Cluster Serving request together, checked from each image's
    # header before it is decoded (413 beyond).
    max_image_pixels: int = 2048 * 2048
    # JSON values in one Cluster Serving request (each a Python object while it is parsed),
    # counted before parsing (413 beyond).
    max_json_values: int = 1_000_000
    # Where workers' direct-mode HTTP ports listen, and the address discovery publishes for
    # them (default: worker_host). Bind a LAN/VPC address (or 0.0.0.0 with an advertised
    # address) so that direct-mode clients on other hosts reach the workers.
    worker_host: str = "127.0.0.1"
    worker_advertise_host: str | None = None
    # The V2 (Open Inference Protocol) gRPC endpoint's port on ``host`` (0: no gRPC endpoint).
    grpc_port: int = 0
    # Where other gateways sharing a Redis queue store reach this one (default: host);
    # required when host listens on every address.
    advertise_host: str | None = None

    @property
    def advertised_worker_host(self) -> str:
        return self.worker_advertise_host or self.worker_host


@dataclass(frozen=True)
class Config:
    gateway: GatewayConfig
    services: tuple[ServiceConfig, ...]
    source: str | None = None

    def service(self, name: str) -> ServiceConfig | None:
        for svc in self.services:
            if svc.name == name:
                return svc
        return None


# --- validation helpers ------------------------------------------------------------


def _key_text(key: Any) -> str:
    return key if isinstance(key, str) else repr(key)


def _check_keys(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(map(_key_text, set(raw) - allowed))  # YAML keys may be null or numbers
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def _coerce_dataclass(cls: type, raw: Any, where: str) -> Any:
    """Generic coercion for the flat numeric/bool/str dataclasses (queue, batching, gateway)."""
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    names = {f.name for f in fields(cls)}
    _check_keys(raw, names, where)
    out: dict[str, Any] = {}
    defaults = cls()
    for key, value in raw.items():
        w = f"{where}.{key}"
        default = getattr(defaults, key)
        if isinstance(default, bool):
            out[key] = _bool(value, w)
        elif isinstance(default, int):
            out[key] = _int(value, w, lo=0)
        elif isinstance(default, float):
            out[key] = _float(value, w, lo=0.0)
        else:
            out[key] = None if value is None else _str(value, w)
    return cls(**out)


def _resolve_path(value: str, base: Path | None, where: str) -> str:
    p = Path(value)
    if p.is_absolute():
        return str(p)
    if p.exists() or base is None:
        return str(p.resolve())
    alt = base / p
    return str(alt.resolve() if alt.exists() else p.resolve())


def _check_file(path: str, where: str) -> None:
    """A missing model or entry file is a config error (exit 2) rather than a worker that
    never loads (the service answering 503 with the reason only in the log)."""
    if not Path(path).is_file():
        what = "not a file" if Path(path).exists() else "file not found"
        raise ConfigError(f"{where}: {what}: {path}")


def _service(raw: Any, i: int, base: Path | None) -> ServiceConfig:
    where = f"services[{i}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    allowed = {
        "name", "processor", "token", "tokens", "model", "entry", "workers", "max_pending",
        "timeout_ms", "intra_op_threads", "request_format", "batching", "async", "queue",
        "config", "env", "stall_timeout_s", "cluster_serving", "versions", "public",
    }  # fmt: skip
    _check_keys(raw, allowed, where)
    name = _str(raw.get("name"), f"{where}.name")
    if not SERVICE_NAME_RE.match(name):
        raise ConfigError(f"{where}.name: {name!r} must match {SERVICE_NAME_RE.pattern}")
    where = f"services[{i}] ({name})"
    processor = _str(raw.get("processor"), f"{where}.processor")
    if processor not in PROCESSORS:
        raise ConfigError(f"{where}.processor: must be one of {', '.join(PROCESSORS)}, got {processor!r}")
    model = raw.get("model")
    entry = raw.get("entry")
    versions = _versions(raw.get("versions"), processor, model, base, where)
    if versions:
        model = versions[-1][1]
    elif processor == "onnx":
        model = _str(model, f"{where}.model")
        model = _resolve_path(model, base, f"{where}.model")
        _check_file(model, f"{where}.model")
    elif model is not None:
        model = _resolve_path(_str(model, f"{where}.model"), base, f"{where}.model")
    if processor == "python":
        entry = _str(entry, f"{where}.entry")
        if ":" not in entry:
            raise ConfigError(f"{where}.entry: expected 'path/to/file.py:Class' or 'package.module:Class'")
        target, _, cls_name = entry.rpartition(":")
        if target.endswith(".py"):
            target = _resolve_path(target, base, f"{where}.entry")
            _check_file(target, f"{where}.entry")
        entry = f"{target}:{cls_name}"
    request_format = raw.get("request_format", "auto")
    if request_format not in REQUEST_FORMATS:
        raise ConfigError(f"{where}.request_format: must be one of {', '.join(REQUEST_FORMATS)}")
    cfg = raw.get("config") or {}
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}.config: expected a mapping")
    env = raw.get("env") or {}
    if not isinstance(env, dict):
        raise ConfigError(f"{where}.env: expected a mapping")
    token, extra_tokens, public = _tokens(raw, where)
    async_ = _bool(raw.get("async", False), f"{where}.async")
    queue = _coerce_dataclass(QueueConfig, raw.get("queue"), f"{where}.queue")
    _check_queue_backend(queue, f"{where}.queue")
    cluster_serving = None
    if raw.get("cluster_serving") is not None:
        cluster_serving = _coerce_dataclass(
            ClusterServingConfig, raw["cluster_serving"], f"{where}.cluster_serving"
        )
        if not cluster_serving.redis.startswith(QUEUE_BACKEND_SCHEMES):
            raise ConfigError(f"{where}.cluster_serving.redis: expected a Redis URL (redis://host:port/db)")
        if processor == "queue":
            raise ConfigError(f"{where}.cluster_serving: a queue service has no model to serve it with")
        if cluster_serving.max_batch < 1:
            raise ConfigError(f"{where}.cluster_serving.max_batch: must be at least 1")
    if async_ and queue.backend != "sqlite":
        raise ConfigError(
            f"{where}.queue.backend: an asynchronous service keeps its queues in the embedded "
            "store (backend: sqlite); Redis holds plain queue services"
        )
    if processor == "queue" and async_:
        raise ConfigError(f"{where}.async: a queue service cannot itself be asynchronous")
    return ServiceConfig(
        name=name,
        processor=processor,
        token=token,
        public=public,
        extra_tokens=extra_tokens,
        model=model,
        entry=entry,
        workers=_int(raw.get("workers", 1), f"{where}.workers", lo=0 if processor == "queue" else 1, hi=64),
        max_pending=_int(raw.get("max_pending", 64), f"{where}.max_pending", lo=1),
        timeout_ms=_int(raw.get("timeout_ms", 5000), f"{where}.timeout_ms", lo=1),
        intra_op_threads=_int(raw.get("intra_op_threads", 1), f"{where}.intra_op_threads", lo=1, hi=64),
        request_format=request_format,
        batching=_coerce_dataclass(BatchingConfig, raw.get("batching"), f"{where}.batching"),
        stall_timeout_s=_float(raw.get("stall_timeout_s", 60.0), f"{where}.stall_timeout_s", lo=0.0),
        async_=async_,
        queue=queue,
        cluster_serving=cluster_serving,
        config=dict(cfg),
        env={str(k): str(v) for k, v in env.items()},
        versions=versions,
    )


def _versions(raw: Any, kind: str, model: Any, base: Path | None, where: str) -> tuple[tuple[str, str], ...]:
    """``versions: {1: a.onnx, 2: b.onnx}``: positive integer versions, each a model file."""
    if raw is None:
        return ()
    w = f"{where}.versions"
    if kind != "onnx":
        raise ConfigError(f"{w}: only an onnx service has model versions")
    if model is not None:
        raise ConfigError(f"{w}: give either model or versions, not both")
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{w}: expected a mapping of version numbers to model files")
    out: dict[int, str] = {}
    for key, path in raw.items():
        number = _int(key, f"{w} key {key!r}", lo=1, hi=2**31 - 1)
        if number in out:
            raise ConfigError(f"{w}: version {number} given twice")
        resolved = _resolve_path(_str(path, f"{w}.{key}"), base, f"{w}.{key}")
        _check_file(resolved, f"{w}.{key}")
        out[number] = resolved
    return tuple((str(n), out[n]) for n in sorted(out))


QUEUE_BACKEND_SCHEMES = ("redis://", "rediss://", "unix://")


def _with_queue_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """The top-level ``queue:`` mapping holds defaults for every service's ``queue:``
    (a service's own keys win), e.g. one Redis backend for all queues."""
    defaults = raw.get("queue")
    if defaults is None:
        return raw
    if not isinstance(defaults, dict):
        raise ConfigError(f"queue: expected a mapping, got {type(defaults).__name__}")
    _coerce_dataclass(QueueConfig, defaults, "queue")  # names the bad key at its own place
    services = raw.get("services")
    if not isinstance(services, list):
        return raw
    merged = [
        {**s, "queue": {**defaults, **(s.get("queue") or {})}} if isinstance(s, dict) else s for s in services
    ]
    return {**raw, "services": merged}


def _check_queue_backend(cfg: QueueConfig, where: str) -> None:
    if cfg.backend != "sqlite" and not cfg.backend.startswith(QUEUE_BACKEND_SCHEMES):
        raise ConfigError(
            f"{where}.backend: expected 'sqlite' or a Redis URL ({', '.join(QUEUE_BACKEND_SCHEMES)}), "
            f"got {cfg.backend!r}"
        )


def parse_config(raw: Any, source: str | None = None) -> Config:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("config: the top level must be a mapping with 'gateway' and 'services'")
    _check_keys(raw, {"gateway", "services", "queue"}, "config")
    raw = _expand(raw, "config")
    raw = _with_queue_defaults(raw)
    base = Path(source).resolve().parent if source else None
    gw = _coerce_dataclass(GatewayConfig, raw.get("gateway"), "gateway")
    if gw.port > 65535:
        raise ConfigError(f"gateway.port: must be <= 65535, got {gw.port}")
    if gw.grpc_port > 65535:
        raise ConfigError(f"gateway.grpc_port: must be <= 65535, got {gw.grpc_port}")
    if gw.log_format not in ("text", "json"):
        raise ConfigError("gateway.log_format: must be 'text' or 'json'")
    if gw.worker_host in _EVERY_ADDRESS and not gw.worker_advertise_host:
        raise ConfigError(
            "gateway.worker_advertise_host: required when worker_host listens on every address "
            f"({gw.worker_host}): discovery must publish an address clients can reach"
        )
    services_raw = raw.get("services") or []
    if not isinstance(services_raw, list):
        raise ConfigError("services: expected a list")
    services = tuple(_service(s, i, base) for i, s in enumerate(services_raw))
    if (
        gw.host in _EVERY_ADDRESS
        and not gw.advertise_host
        and any(s.queue.backend != "sqlite" for s in services if s.processor == "queue")
    ):
        raise ConfigError(
            f"gateway.advertise_host: required when host listens on every address ({gw.host}) and "
            "queues live in Redis: other gateways on the same Redis forward calls there"
        )
    seen: set[str] = set()
    for svc in services:
        if svc.name in seen:
            raise ConfigError(f"services: duplicate service name {svc.name!r}")
        seen.add(svc.name)
    return apply_env_overrides(Config(gateway=gw, services=services, source=source))


def apply_env_overrides(cfg: Config, environ: Mapping[str, str] | None = None) -> Config:
    env = os.environ if environ is None else environ
    changes: dict[str, Any] = {}
    if env.get("EASGW_HOST"):
        changes["host"] = env["EASGW_HOST"]
    if env.get("EASGW_PORT"):
        changes["port"] = _int(env["EASGW_PORT"], "EASGW_PORT", lo=0, hi=65535)
    if env.get("EASGW_DATA_DIR"):
        changes["data_dir"] = env["EASGW_DATA_DIR"]
    if env.get("EASGW_LOG_LEVEL"):
        changes["log_level"] = env["EASGW_LOG_LEVEL"]
    if env.get("EASGW_LOOPBACK_ONLY"):
        changes["loopback_only"] = _bool(env["EASGW_LOOPBACK_ONLY"], "EASGW_LOOPBACK_ONLY")
    if not changes:
        return cfg
    return replace(cfg, gateway=replace(cfg.gateway, **changes))


def load_config(path: str | os.PathLike[str]) -> Config:
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config: cannot read {p}: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config: {p} is not valid YAML: {exc}") from None
    return parse_config(raw, source=str(p))
