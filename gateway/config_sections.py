"""Sections of the configuration that stand on their own: a service's queue, Cluster
Serving stream, batching and remote workers, the top-level queue defaults, and the
coercion of a flat mapping into one of these dataclasses (every key checked, every error
named with its place). gateway.config re-exports the dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from gateway.config_values import ConfigError
from gateway.config_values import Errors as _Errors
from gateway.config_values import as_bool as _bool
from gateway.config_values import as_float as _float
from gateway.config_values import as_int as _int
from gateway.config_values import as_str as _str
from gateway.config_values import check_keys as _check_keys


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
class RemoteWorkersConfig:
    """Workers on other hosts may join the service (``eas-gateway worker``)."""

    # The secret a remote worker registers with and the gateway opens its connections
    # with; never a client token (a client must not be able to receive other clients' calls).
    token: str = ""
    # A remote worker not heard from (registration, heartbeat) for this long is removed.
    ttl_s: float = 6.0


def coerce_dataclass(cls: type, raw: Any, where: str) -> Any:
    """Generic coercion for the flat numeric/bool/str dataclasses (queue, batching, gateway)."""
    out, errs = coerce_partial(cls, raw, where)
    errs.raise_any()
    return out


def coerce_partial(cls: type, raw: Any, where: str) -> tuple[Any, _Errors]:
    """The dataclass built from the keys that are right, and the errors of the others."""
    errs = _Errors()
    if raw is None:
        return cls(), errs
    if not isinstance(raw, dict):
        errs.add(f"{where}: expected a mapping, got {type(raw).__name__}")
        return cls(), errs
    names = {f.name for f in fields(cls)}
    errs.check(_check_keys, raw, names, where)
    out: dict[str, Any] = {}
    defaults = cls()
    for key, value in raw.items():
        if key not in names:
            continue
        w = f"{where}.{key}"
        default = getattr(defaults, key)
        if isinstance(default, bool):
            out[key] = errs.check(_bool, value, w, default=default)
        elif isinstance(default, int):
            out[key] = errs.check(_int, value, w, lo=0, default=default)
        elif isinstance(default, float):
            out[key] = errs.check(_float, value, w, lo=0.0, default=default)
        else:
            out[key] = None if value is None else errs.check(_str, str(value), w, default=default)
    return cls(**out), errs


def remote_workers(raw: Any, where: str) -> RemoteWorkersConfig | None:
    if raw is None:
        return None
    cfg = coerce_dataclass(RemoteWorkersConfig, raw, where)
    if len(cfg.token) < 16:
        raise ConfigError(f"{where}.token: a secret of at least 16 characters is required")
    if cfg.ttl_s <= 0:
        raise ConfigError(f"{where}.ttl_s: must be > 0")
    return cfg


QUEUE_BACKEND_SCHEMES = ("redis://", "rediss://", "unix://")


def with_queue_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """The top-level ``queue:`` mapping holds defaults for every service's ``queue:``
    (a service's own keys win), e.g. one Redis backend for all queues."""
    defaults = raw.get("queue")
    if defaults is None:
        return raw
    if not isinstance(defaults, dict):
        raise ConfigError(f"queue: expected a mapping, got {type(defaults).__name__}")
    coerce_dataclass(QueueConfig, defaults, "queue")  # names the bad key at its own place
    services = raw.get("services")
    if not isinstance(services, list):
        return raw
    merged = [
        {**s, "queue": {**defaults, **(s.get("queue") or {})}} if isinstance(s, dict) else s for s in services
    ]
    return {**raw, "services": merged}


def check_queue_backend(cfg: QueueConfig, where: str) -> None:
    if cfg.backend != "sqlite" and not cfg.backend.startswith(QUEUE_BACKEND_SCHEMES):
        raise ConfigError(
            f"{where}.backend: expected 'sqlite' or a Redis URL ({', '.join(QUEUE_BACKEND_SCHEMES)}), "
            f"got {cfg.backend!r}"
        )


def cluster_serving(raw: Any, processor: str, where: str) -> ClusterServingConfig | None:
    if raw is None:
        return None
    cs = coerce_dataclass(ClusterServingConfig, raw, f"{where}.cluster_serving")
    if not cs.redis.startswith(QUEUE_BACKEND_SCHEMES):
        raise ConfigError(f"{where}.cluster_serving.redis: expected a Redis URL (redis://host:port/db)")
    if processor == "queue":
        raise ConfigError(f"{where}.cluster_serving: a queue service has no model to serve it with")
    if cs.max_batch < 1:
        raise ConfigError(f"{where}.cluster_serving.max_batch: must be at least 1")
    return cs
