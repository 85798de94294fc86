"""Gateway configuration: one YAML file validated into frozen dataclasses.

Strings may reference environment variables as ``${NAME}`` (an unset variable
is an error naming the field). A few top-level settings can be overridden by
environment variables: EASGW_HOST, EASGW_PORT, EASGW_DATA_DIR, EASGW_LOG_LEVEL.
Relative file paths (model, entry file) are resolved against the working
directory first and then against the config file's directory; a model service's
``model`` (onnx, sklearn, xgboost, lightgbm) and a python service's ``entry`` file (the
``path/to/file.py:Class`` form) must exist.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway.config.autoscale import AutoscaleConfig, parse_autoscale
from gateway.config.catalog import (
    DECLARED_INPUTS,
    DECLARED_OUTPUTS,
    DEVICE_PROCESSORS,
    MODEL_PROCESSORS,
    ONE_INPUT,
)
from gateway.config.groups import Groups, parse_groups
from gateway.config.located import relocated
from gateway.config.mirror import MirrorConfig, mirror_problems, parse_mirror
from gateway.config.model_urls import ModelSource
from gateway.config.payload_log import PayloadLogConfig, check_payload_sinks, parse_payload_log
from gateway.config.pipelines import PipelineSpec, TensorDecl, check_pipelines, pipeline_of, tensor_decls
from gateway.config.placement import DEFAULT_PLACEMENT, PLACEMENTS, process_needs, resolve_placement
from gateway.config.ports import port_clashes
from gateway.config.sections import (
    AdminConfig,
    BatchingConfig,
    ClusterServingConfig,
    QueueConfig,
    RemoteWorkersConfig,
)
from gateway.config.sources import parse_model_sources
from gateway.config.tls import TlsConfig, parse_tls
from gateway.config.traffic import parse_traffic
from gateway.config.values import QUEUE_BACKEND_SCHEMES, ConfigError, is_loopback
from gateway.config.values import Errors as _Errors
from gateway.config.values import as_bool as _bool
from gateway.config.values import as_choice as _choice
from gateway.config.values import as_env as _env
from gateway.config.values import as_float as _float
from gateway.config.values import as_int as _int
from gateway.config.values import as_mapping as _mapping
from gateway.config.values import as_max_skew as _max_skew
from gateway.config.values import as_providers as _providers
from gateway.config.values import as_str as _str
from gateway.config.values import as_versions as _versions
from gateway.config.values import check_keys as _check_keys
from gateway.config.values import check_model_dirs as check_model_dirs
from gateway.config.values import check_queue_backend as _check_queue_backend
from gateway.config.values import coerce_dataclass as _coerce_dataclass
from gateway.config.values import coerce_partial as _coerce_partial
from gateway.config.values import entry_path as _entry
from gateway.config.values import expand as _expand
from gateway.config.values import model_path as _model_path
from gateway.config.values import open_service_warnings as open_service_warnings
from gateway.config.values import respelt as _respelt
from gateway.config.values import tokens_of as _tokens_of

_UNSET = object()  # an entry that could not be expanded
SERVICE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
PROCESSORS = (*MODEL_PROCESSORS, "python", "queue", "pipeline")
REQUEST_FORMATS = ("auto", "tf", "torch", "blade", "json")
# Listen addresses meaning "every interface": compared against, never bound here.
_EVERY_ADDRESS = ("0.0.0.0", "::")  # noqa: S104 - a value to recognise, not a bind

# How a worker process asks the kernel to schedule it (gateway.worker.scheduling applies it).
SCHEDULING_POLICIES = ("batch", "normal")


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
    # ONNX Runtime: the execution providers to try, in order, and threads between operators.
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    inter_op_threads: int = 1
    # A model service: where the model runs: ``process`` (worker processes) or ``thread`` (the
    # model loaded in the gateway process, ``workers`` times; gateway.backends.threads); the
    # config's ``auto`` resolved (gateway.config.placement), never ``auto`` itself.
    placement: str = "process"
    # Why ``auto`` chose the placement; empty where the config names it.
    placement_reason: str = ""
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
    # Names passed through from the gateway's environment (``env: {NAME: null}`` or a list of
    # names); a worker has no other variable of the gateway's but the basics (process.py).
    env_pass: tuple[str, ...] = ()
    # A model service: (version, model file) ascending, ``model`` the latest's; empty: one version, "1".
    versions: tuple[tuple[str, str], ...] = ()
    # The share of calls each version takes when a call names none (gateway.config.traffic);
    # empty: the latest takes them all.
    traffic: tuple[tuple[str, int], ...] = ()
    # A share of the calls copied to another version or service, answers discarded; None: none.
    mirror: MirrorConfig | None = None
    # sklearn, xgboost, lightgbm: the model's input as the service declares it (name, dtype,
    # shape), where the model file does not say it (gateway.worker.processors.estimator).
    inputs: tuple[TensorDecl, ...] = ()
    # python: the outputs its class gives, as the service declares them (with ``inputs``: its
    # tensors, gateway.worker.processors.user_tensors).
    outputs: tuple[TensorDecl, ...] = ()
    # torch: the device the module runs on (``cpu``, ``cuda``, ``cuda:1``).
    device: str = "cpu"
    pipeline: PipelineSpec | None = None  # a pipeline service's steps (docs/pipelines.md)
    # None: only the gateway's own worker processes serve the service.
    remote_workers: RemoteWorkersConfig | None = None
    # The service's own EAS signature Date window (see GatewayConfig); None: the gateway's.
    signature_max_skew_s: float | str | None = None
    # A share of the calls written as CloudEvents to a sink (gateway.config.payload_log); None: off.
    payload_log: PayloadLogConfig | None = None
    # Another service that explains this model's calls (KServe's ``:explain``), given the same
    # inputs; None: the model's own processor explains them, when it can.
    explainer: str | None = None
    # Paddle Serving's pipeline gRPC service for this service on its own port (Paddle's
    # ``rpc_port``, on the gateway's host); 0: none.
    rpc_port: int = 0
    # The worker count follows the load within bounds (gateway.config.autoscale); None: fixed.
    autoscale: AutoscaleConfig | None = None

    # Cached: read on every call (a frozen config never changes; a changed service is a new one).
    @functools.cached_property
    def tokens(self) -> tuple[str, ...]:
        return ((self.token,) if self.token else ()) + self.extra_tokens

    @functools.cached_property
    def version_names(self) -> tuple[str, ...]:
        """The model versions served, ascending; the last is the latest (the default)."""
        return tuple(v for v, _ in self.versions) or ("1",)

    def __repr__(self) -> str:  # never show tokens
        return (
            f"ServiceConfig(name={self.name!r}, processor={self.processor!r}, workers={self.workers}, "
            f"token={'***' if self.tokens else None})"
        )


# The longest busy-poll window: past a few milliseconds polling stops paying for itself (the
# client is not about to call) and only burns the core.
MAX_BUSY_POLL_US = 10_000


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
    # Restarts of a failing worker back off exponentially up to this many seconds.
    restart_backoff_max_s: float = 30.0
    health_interval_s: float = 1.0
    # Payload log events waiting for their sinks, all services together; past it one is dropped.
    payload_log_buffer: int = 10000
    # OpenTelemetry traces sent over OTLP/HTTP to this URL (the tracing extra); None: tracing off.
    trace_endpoint: str | None = None
    # The share of calls traced when no sampled traceparent comes with them, 0 to 1.
    trace_sample_ratio: float = 1.0
    # Spans are sent in batches this often (each process its own).
    trace_export_interval_ms: int = 5000
    # How often the status page's history (the last hour, kept by the gateway) takes a point.
    status_history_interval_s: float = 5.0
    access_log: bool = True
    # Plain queue calls / plain predict calls answered by the lean HTTP/1.1 front
    # (gateway/fronts/fast_front.py); everything else still goes to aiohttp on the same
    # connection. Both off: aiohttp serves all.
    queue_fast_path: bool = True
    predict_fast_path: bool = True
    # After an answer, the lean front's loop polls for the next request this long instead
    # of sleeping (0: off): lower latency for callers one at a time, paid in CPU
    # (gateway/lean_http/spin.py).
    busy_poll_us: int = 0
    log_level: str = "INFO"
    log_format: str = "text"
    discovery_requires_token: bool = False
    # Refuse non-loopback listen/upstream addresses (tests set EASGW_LOOPBACK_ONLY=1).
    loopback_only: bool = False
    # The service a bare Cluster Serving ``POST /predict`` goes to (default: the only one).
    cluster_serving_service: str | None = None
    # Gateway-wide admission (gateway/core/admission.py; 0 turns a limit off): open connections
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
    # The EAS signature: a Date within the offset of any time zone ("any_zone": the reference
    # clients send local time labelled GMT) or within this many seconds either way of the
    # gateway's clock (0: not checked), Content-MD5 required with a body, the signed
    # Content-Type the one sent, and an optional cache of this many signatures seen (a replay
    # within the window gets 401; 0: off).
    signature_max_skew_s: float | str = "any_zone"
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
    # The kernel's scheduling policy for worker processes on Linux (gateway/worker/scheduling.py):
    # "batch" (SCHED_BATCH) lets whatever runs on a core finish its turn when a worker thread
    # wakes; "normal" leaves them as any process.
    worker_scheduling: str = "batch"
    # The V2 (Open Inference Protocol) gRPC endpoint's port on ``host`` (0: no gRPC endpoint).
    grpc_port: int = 0
    # Where other gateways sharing a Redis queue store reach this one (default: host);
    # required when host listens on every address.
    advertise_host: str | None = None
    # Folders model and entry files must be in (after resolving links); empty: anywhere.
    model_dirs: tuple[str, ...] = ()
    # Models named by a URL (gateway.config.model_urls): where their stores are and whose
    # credentials to use, by URL prefix; and the folder they are downloaded to (None: the
    # data_dir's ``models``), reused across restarts while the object is unchanged.
    model_sources: tuple[ModelSource, ...] = ()
    model_cache_dir: str | None = None
    # HTTPS on ``port`` and TLS on ``grpc_port`` (None: plain; ``grpc_tls`` None: ``tls``'s),
    # and mTLS on the link to remote workers (gateway.config.tls; loaded again on SIGHUP).
    tls: TlsConfig | None = None
    grpc_tls: TlsConfig | None = None
    worker_tls: TlsConfig | None = None

    @property
    def advertised_worker_host(self) -> str:
        return self.worker_advertise_host or self.worker_host


@dataclass(frozen=True)
class Config:
    gateway: GatewayConfig
    services: tuple[ServiceConfig, ...]
    source: str | None = None
    admin: AdminConfig | None = None
    # Service groups: a name whose calls go to its member services by share (gateway.config.groups).
    groups: Groups = ()

    def service(self, name: str) -> ServiceConfig | None:
        for svc in self.services:
            if svc.name == name:
                return svc
        return None

    def set_services(self, services: tuple[ServiceConfig, ...]) -> None:
        """Replace the running gateway's services (the service manager, gateway.manage).

        Every route reads the one Config of the application, so the manager swaps the
        tuple here: one assignment, so a reader sees the old set or the new one, whole."""
        object.__setattr__(self, "services", tuple(services))


# --- validation ----------------------------------------------------------------------


def parse_service(raw: Any, base: Path | None = None, where: str = "service") -> ServiceConfig:
    """One service description (a ``services:`` entry of the config file, or the admin API's
    body) -> a validated ServiceConfig; relative paths resolve against ``base`` too."""
    return _service(_expand(raw, where), 0, base, where)


_SERVICE_KEYS = {
    "name", "processor", "token", "tokens", "model", "entry", "workers", "max_pending",
    "timeout_ms", "intra_op_threads", "request_format", "batching", "async", "queue",
    "config", "env", "stall_timeout_s", "public", "providers", "inter_op_threads", "cluster_serving",
    "versions", "pipeline", "remote_workers", "placement", "signature_max_skew_s", "inputs",
    "payload_log", "explainer", "outputs",
    "device", "traffic", "rpc_port", "autoscale", "mirror",
}  # fmt: skip


def _service(raw: Any, i: int, base: Path | None, prefix: str | None = None) -> ServiceConfig:
    """One ``services:`` entry; every error in it is reported (ConfigErrors), each with its place."""
    prefix = prefix or f"services[{i}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix}: expected a mapping, got {type(raw).__name__}")
    errs = _Errors()
    # A misspelt key is read as the key it is close to: the misspelling is its one error.
    given, raw = raw, _respelt(raw, _SERVICE_KEYS)
    name = errs.check(_str, raw.get("name"), f"{prefix}.name", default="")
    if name and not SERVICE_NAME_RE.match(name):
        errs.add(f"{prefix}.name: {name!r} must match {SERVICE_NAME_RE.pattern}")
    where = f"{prefix} ({name})" if name else prefix
    errs.check(_check_keys, given, _SERVICE_KEYS, where)
    processor = errs.check(_str, raw.get("processor"), f"{where}.processor", default="")
    if processor and processor not in PROCESSORS:
        errs.add(f"{where}.processor: must be one of {', '.join(PROCESSORS)}, got {processor!r}")
    token, extra_tokens, public = errs.check(_tokens_of, raw, where, default=(None, (), False))
    versions = errs.check(
        _versions, raw.get("versions"), processor, raw.get("model"), base, where, default=()
    )
    traffic = errs.check(
        parse_traffic, raw.get("traffic"), [v for v, _ in versions], f"{where}.traffic", default=()
    )
    mirror = errs.check(parse_mirror, raw.get("mirror"), [v for v, _ in versions], f"{where}.mirror")
    if versions:
        model: str | None = versions[-1][1]
    else:
        model = errs.check(_model_path, raw, processor, base, where)
    entry = errs.check(_entry, raw, processor, base, where)
    request_format = errs.check(
        _choice, raw.get("request_format", "auto"), REQUEST_FORMATS, f"{where}.request_format", default="auto"
    )
    cfg = errs.check(_mapping, raw.get("config"), f"{where}.config", default={})
    env, env_pass = errs.check(_env, raw.get("env"), f"{where}.env", default=({}, ()))
    async_ = errs.check(_bool, raw.get("async", False), f"{where}.async", default=False)
    if processor == "queue" and async_:
        errs.add(f"{where}.async: a queue service cannot itself be asynchronous")
    remote = errs.check(_remote_workers, raw.get("remote_workers"), f"{where}.remote_workers")
    placement = errs.check(
        _choice, raw.get("placement", DEFAULT_PLACEMENT), PLACEMENTS, f"{where}.placement", default="auto"
    )
    if placement == "thread":
        # Model runtimes release the GIL while they compute; user code, a pipeline or a queue
        # has no model to run in the gateway's threads.
        if processor and processor not in MODEL_PROCESSORS:
            errs.add(
                f"{where}.placement: only a model service ({', '.join(MODEL_PROCESSORS)}) "
                "can run in the gateway's threads (thread)"
            )
        elif remote is not None:
            errs.add(f"{where}.placement: a service run in the gateway's threads has no remote workers")
    # A queue service has no workers; one served by remote workers may have no local ones.
    lo_workers = 0 if processor == "queue" or remote is not None else 1
    values = {
        "workers": errs.check(
            _int, raw.get("workers", 1), f"{where}.workers", lo=lo_workers, hi=64, default=1
        ),
        "max_pending": errs.check(_int, raw.get("max_pending", 64), f"{where}.max_pending", lo=1, default=64),
        "timeout_ms": errs.check(_int, raw.get("timeout_ms", 5000), f"{where}.timeout_ms", lo=1, default=1),
        "intra_op_threads": errs.check(
            _int, raw.get("intra_op_threads", 1), f"{where}.intra_op_threads", lo=1, hi=64, default=1
        ),
        "inter_op_threads": errs.check(
            _int, raw.get("inter_op_threads", 1), f"{where}.inter_op_threads", lo=1, hi=64, default=1
        ),
        "providers": errs.check(
            _providers, raw.get("providers", ["CPUExecutionProvider"]), f"{where}.providers", default=()
        ),
        "batching": errs.check(
            _coerce_dataclass, BatchingConfig, raw.get("batching"), f"{where}.batching", default=None
        ),
        "stall_timeout_s": errs.check(
            _float, raw.get("stall_timeout_s", 60.0), f"{where}.stall_timeout_s", lo=0.0, default=60.0
        ),
        "queue": errs.check(_coerce_dataclass, QueueConfig, raw.get("queue"), f"{where}.queue", default=None),
        "rpc_port": errs.check(_int, raw.get("rpc_port", 0), f"{where}.rpc_port", lo=0, hi=65535, default=0),
        "payload_log": errs.check(parse_payload_log, raw.get("payload_log"), f"{where}.payload_log"),
        "signature_max_skew_s": None
        if raw.get("signature_max_skew_s") is None
        else errs.check(_max_skew, raw["signature_max_skew_s"], f"{where}.signature_max_skew_s"),
    }
    queue = values["queue"]
    if queue is not None:
        errs.check(_check_queue_backend, queue, f"{where}.queue")
    cluster_serving = errs.check(_cluster_serving, raw.get("cluster_serving"), processor, where)
    pipeline = errs.check(pipeline_of, raw, processor, where, base)
    inputs = errs.check(_declared_inputs, raw.get("inputs"), processor, f"{where}.inputs", default=())
    outputs = errs.check(_declared_outputs, raw.get("outputs"), processor, f"{where}.outputs", default=())
    device = errs.check(_device, raw.get("device"), processor, f"{where}.device", default="cpu")
    explainer = raw.get("explainer")
    if explainer is not None and (not isinstance(explainer, str) or not SERVICE_NAME_RE.fullmatch(explainer)):
        errs.add(f"{where}.explainer: expected the name of another service")
    autoscale = errs.check(parse_autoscale, raw.get("autoscale"), f"{where}.autoscale")
    needs = process_needs(
        raw, remote=remote is not None, autoscale=autoscale is not None, env=bool(env or env_pass)
    )
    placement, placement_reason = resolve_placement(placement, processor, needs)
    if autoscale is not None and processor in ("queue", "pipeline"):
        errs.add(f"{where}.autoscale: only a service run by worker processes scales its workers")
    elif autoscale is not None and placement == "thread":
        errs.add(
            f"{where}.autoscale: a service run in the gateway's threads has no worker processes to "
            "scale; set placement: process (or leave placement out)"
        )
    errs.raise_any()
    return ServiceConfig(
        name=name,
        processor=processor,
        token=token,
        public=public,
        extra_tokens=extra_tokens,
        model=model,
        entry=entry,
        request_format=request_format,
        async_=async_,
        config=dict(cfg),
        env=env,
        env_pass=env_pass,
        cluster_serving=cluster_serving,
        versions=versions,
        traffic=traffic,
        mirror=mirror,
        pipeline=pipeline,
        remote_workers=remote,
        placement=placement,
        placement_reason=placement_reason,
        inputs=inputs,
        device=device,
        explainer=explainer,
        outputs=outputs,
        autoscale=autoscale,
        **values,
    )


def _declared_inputs(raw: Any, processor: str, where: str) -> tuple[TensorDecl, ...]:
    """``inputs: {name: {dtype, shape}}``: the one feature matrix an estimator takes."""
    if raw is None:
        return ()
    if processor not in DECLARED_INPUTS:
        raise ConfigError(f"{where}: only a {', '.join(DECLARED_INPUTS)} service declares its inputs")
    decls = tensor_decls(raw, where)
    if processor in DECLARED_OUTPUTS:
        return _shaped(decls, where)
    if processor in ONE_INPUT and len(decls) != 1:
        raise ConfigError(f"{where}: the model takes one input (its feature matrix); {len(decls)} given")
    return decls


def _declared_outputs(raw: Any, processor: str, where: str) -> tuple[TensorDecl, ...]:
    """``outputs: {name: {dtype, shape}}``: what a python class's predict gives."""
    if raw is None:
        return ()
    if processor not in DECLARED_OUTPUTS:
        raise ConfigError(f"{where}: only a {', '.join(DECLARED_OUTPUTS)} service declares its outputs")
    return _shaped(tensor_decls(raw, where), where)


def _shaped(decls: tuple[TensorDecl, ...], where: str) -> tuple[TensorDecl, ...]:
    """User code's tensors: each with its dtype and shape, as its model metadata says them."""
    for d in decls:
        if d.dtype is None or d.shape is None:
            raise ConfigError(
                f"{where}.{d.name}: give its dtype and shape ({{dtype: float32, shape: [-1, 4]}})"
            )
    return decls


DEVICE_RE = re.compile(r"^(cpu|cuda(:[0-9]{1,3})?)$")


def _device(raw: Any, processor: str, where: str) -> str:
    """``device: cuda:0``: where a runtime that can use a GPU runs the model."""
    if raw is None:
        return "cpu"
    if processor not in DEVICE_PROCESSORS:
        raise ConfigError(f"{where}: only a {', '.join(DEVICE_PROCESSORS)} service runs on a device it names")
    if not isinstance(raw, str) or not DEVICE_RE.match(raw):
        raise ConfigError(f"{where}: expected cpu, cuda or cuda:N, got {str(raw)[:32]!r}")
    return raw


def _remote_workers(raw: Any, where: str) -> RemoteWorkersConfig | None:
    if raw is None:
        return None
    cfg: RemoteWorkersConfig = _coerce_dataclass(RemoteWorkersConfig, raw, where)
    if len(cfg.token) < 16:
        raise ConfigError(f"{where}.token: a secret of at least 16 characters is required")
    if cfg.ttl_s <= 0:
        raise ConfigError(f"{where}.ttl_s: must be > 0")
    return cfg


def _cluster_serving(raw: Any, processor: str, where: str) -> ClusterServingConfig | None:
    if raw is None:
        return None
    cs: ClusterServingConfig = _coerce_dataclass(ClusterServingConfig, raw, f"{where}.cluster_serving")
    if not cs.redis.startswith(QUEUE_BACKEND_SCHEMES):
        raise ConfigError(f"{where}.cluster_serving.redis: expected a Redis URL (redis://host:port/db)")
    if processor == "queue":
        raise ConfigError(f"{where}.cluster_serving: a queue service has no model to serve it with")
    if cs.max_batch < 1:
        raise ConfigError(f"{where}.cluster_serving.max_batch: must be at least 1")
    if cs.top_n_output and not cs.top_n:
        raise ConfigError(f"{where}.cluster_serving.top_n_output: names the probabilities for top_n; set it")
    return cs


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
    merged = [  # each service keeping its keys' lines, for the errors that name them
        relocated(s, {**s, "queue": {**defaults, **(s.get("queue") or {})}}) if isinstance(s, dict) else s
        for s in services
    ]
    return {**raw, "services": merged}


def _gateway(raw: Any) -> GatewayConfig:
    raw = _expand(raw, "gateway")
    # A number or a word: read here, not by the generic reader (which takes one type per key).
    skew = raw.pop("signature_max_skew_s", _UNSET) if isinstance(raw, dict) else _UNSET
    sources = raw.pop("model_sources", None) if isinstance(raw, dict) else None
    tls = {k: raw.pop(k, None) for k in ("tls", "grpc_tls", "worker_tls")} if isinstance(raw, dict) else {}
    gw, errs = _coerce_partial(GatewayConfig, raw, "gateway")
    if sources is not None:
        gw = replace(
            gw, model_sources=errs.check(parse_model_sources, sources, "gateway.model_sources", default=())
        )
    for key, value in tls.items():
        if value is not None:
            mutual = key == "worker_tls"
            gw = replace(gw, **{key: errs.check(parse_tls, value, f"gateway.{key}", mutual=mutual)})
    if skew is not _UNSET:
        skew = errs.check(_max_skew, skew, "gateway.signature_max_skew_s", default=gw.signature_max_skew_s)
        gw = replace(gw, signature_max_skew_s=skew)
    if gw.port > 65535:
        errs.add(f"gateway.port: must be <= 65535, got {gw.port}")
    if gw.grpc_port > 65535:
        errs.add(f"gateway.grpc_port: must be <= 65535, got {gw.grpc_port}")
    if not 0.0 <= gw.trace_sample_ratio <= 1.0:
        ratio = gw.trace_sample_ratio
        errs.add(f"gateway.trace_sample_ratio: the share of calls traced, from 0 to 1; got {ratio:g}")
    if gw.trace_endpoint is not None and not gw.trace_endpoint.startswith(("http://", "https://")):
        errs.add("gateway.trace_endpoint: an OTLP/HTTP URL, such as http://127.0.0.1:4318/v1/traces")
    if not 0 <= gw.busy_poll_us <= MAX_BUSY_POLL_US:
        limit, got = MAX_BUSY_POLL_US, gw.busy_poll_us
        errs.add(f"gateway.busy_poll_us: from 0 (off) to {limit} microseconds; got {got}")
    if gw.payload_log_buffer < 1:
        errs.add("gateway.payload_log_buffer: must be >= 1")
    if gw.status_history_interval_s <= 0:
        errs.add("gateway.status_history_interval_s: must be > 0")
    if gw.log_format not in ("text", "json"):
        errs.add("gateway.log_format: must be 'text' or 'json'")
    if gw.worker_scheduling not in SCHEDULING_POLICIES:
        errs.add(f"gateway.worker_scheduling: must be {' or '.join(map(repr, SCHEDULING_POLICIES))}")
    if gw.worker_host in _EVERY_ADDRESS and not gw.worker_advertise_host:
        errs.add(
            "gateway.worker_advertise_host: required when worker_host listens on every address "
            f"({gw.worker_host}): discovery must publish an address clients can reach"
        )
    errs.raise_any()
    return gw


def _admin(raw: Any) -> AdminConfig | None:
    if raw is None:
        return None
    admin: AdminConfig = _coerce_dataclass(AdminConfig, _expand(raw, "admin"), "admin")
    if admin.port > 65535:
        raise ConfigError(f"admin.port: must be <= 65535, got {admin.port}")
    if not admin.token and not is_loopback(admin.host):
        raise ConfigError(
            f"admin.token: required when the admin API listens on {admin.host!r}, not a loopback address"
        )
    return admin


def source_prefixes(gw: GatewayConfig) -> tuple[str, ...]:
    """The URL prefixes of the configured model sources (model URLs allowed with model_dirs)."""
    return tuple(s.prefix for s in gw.model_sources)


def parse_config(raw: Any, source: str | None = None) -> Config:
    """A parsed YAML document -> Config. Every error in it is reported at once (ConfigErrors,
    one line each, each naming its place in the file)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("config: the top level must be a mapping with 'gateway' and 'services'")
    errs = _Errors()
    errs.check(_check_keys, raw, {"gateway", "services", "admin", "queue", "groups"}, "config")
    raw = errs.check(_with_queue_defaults, raw, default=raw)
    base = Path(source).resolve().parent if source else None
    gw = errs.check(_gateway, raw.get("gateway"), default=GatewayConfig())
    admin = errs.check(_admin, raw.get("admin"))
    services_raw = raw.get("services") or []
    if not isinstance(services_raw, list):
        errs.add("services: expected a list")
        services_raw = []
    parsed = []
    for i, raw_svc in enumerate(services_raw):
        # An entry whose ${VAR} is not set is reported once, for that, not again as malformed.
        expanded = errs.check(_expand, raw_svc, f"services[{i}]", default=_UNSET)
        parsed.append(None if expanded is _UNSET else errs.check(_service, expanded, i, base))
    for i, svc in enumerate(parsed):
        if svc is not None:
            errs.check(
                check_model_dirs, svc, gw.model_dirs, f"services[{i}] ({svc.name})", source_prefixes(gw)
            )
    services = tuple(s for s in parsed if s is not None)
    if (
        gw.host in _EVERY_ADDRESS
        and not gw.advertise_host
        and any(s.queue.backend != "sqlite" for s in services if s.processor == "queue" or s.async_)
    ):
        errs.add(
            f"gateway.advertise_host: required when host listens on every address ({gw.host}) and "
            "queues live in Redis: other gateways on the same Redis forward calls there"
        )
    seen: set[str] = set()
    for svc in services:
        if svc.name in seen:
            errs.add(f"services: duplicate service name {svc.name!r}")
        seen.add(svc.name)
    errs.check(check_pipelines, services)
    for problem in check_payload_sinks(services):
        errs.add(problem)
    _check_explainers(services, errs)
    for problem in mirror_problems(services):
        errs.add(problem)
    groups = errs.check(parse_groups, raw.get("groups"), services, SERVICE_NAME_RE, default=())
    cfg = apply_env_overrides(
        Config(gateway=gw, services=services, source=source, admin=admin, groups=groups)
    )
    for clash in port_clashes(cfg.gateway, admin, services=cfg.services):
        errs.add(clash)
    errs.raise_any()
    return cfg


def _check_explainers(services: Sequence[ServiceConfig], errs: _Errors) -> None:
    """An explainer names another service that runs on workers (not a queue, not itself)."""
    by_name = {s.name: s for s in services}
    for i, svc in enumerate(services):
        if svc.explainer is None:
            continue
        target = by_name.get(svc.explainer)
        where = f"services[{i}].explainer"
        if target is None:
            errs.add(f"{where}: no service named {svc.explainer!r}")
        elif target is svc:
            errs.add(f"{where}: a model is not its own explainer; give its processor an explain() method")
        elif target.processor == "queue":
            errs.add(f"{where}: {svc.explainer!r} is a queue; an explainer runs a model or user code")


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

    from gateway.config.located import load_yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config: cannot read {p}: {exc.strerror}") from None
    try:
        raw = load_yaml(text)  # safe_load, keeping each key's line for the errors that name one
    except yaml.YAMLError as exc:
        raise ConfigError(f"config: {p} is not valid YAML: {exc}") from None
    return parse_config(raw, source=str(p))
