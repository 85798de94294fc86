"""The configuration's small sections, each a flat dataclass checked key by key
(gateway.config.values.coerce_dataclass): a service's queue, Cluster Serving stream,
batching and remote workers, and the admin API's listener. gateway.config re-exports them."""

from __future__ import annotations

from dataclasses import dataclass


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
    # Payload bytes of one queue's records kept in memory; beyond it a payload stays on disk
    # only (SQLite) and is read back when delivered. The records' metadata is always in memory.
    memory_bytes: int = 64 * 1024 * 1024
    # Payload bytes one queue may hold (a put beyond it gets 429). 0: what the queue holds at
    # start plus half the disk space then free in data_dir (no byte cap for Redis).
    max_bytes: int = 0
    # A get answers at most this many payload bytes (always at least one record).
    max_get_bytes: int = 32 * 1024 * 1024
    # A watcher holding records that neither reads nor commits any for this long is closed
    # (1008) and its records go back to its group. 0: never (a long inference looks the same).
    watcher_idle_s: float = 0.0
    # A consumer group with no connected consumer for this long is deleted, with the records
    # only it still needed (0: groups are kept until deleted through the admin API).
    group_idle_ttl_s: float = 86400.0
    # A put on a full queue evicts the oldest record that only groups idle (no connected
    # consumer) for at least this long still need, instead of answering 429 (0: never).
    group_evict_idle_s: float = 3600.0


@dataclass(frozen=True)
class ClusterServingConfig:
    """A service that also serves Cluster Serving's own Redis stream (bigdl-serving's
    ``InputQueue``/``OutputQueue`` in Redis mode; docs/async-inference.md)."""

    redis: str = ""  # redis://host:port/db
    stream: str = "serving_stream"  # the clients' ``name``
    group: str = "serving"  # the consumer group every gateway reads the stream with
    max_batch: int = 32  # records read (and inferred) at once
    claim_idle_s: float = 30.0  # records a gone gateway read but never answered are taken after this
    # Cluster Serving's top-N answer: each result is its ``top_n`` most probable classes as
    # ``[[class, probability], ...]``, most probable first; 0: the whole result. ``top_n_output``
    # names the output of class probabilities for a model with several.
    top_n: int = 0
    top_n_output: str = ""


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


@dataclass(frozen=True)
class AdminConfig:
    """The admin API's own listener (gateway.fronts.admin.api); off unless configured."""

    host: str = "127.0.0.1"
    port: int = 8081
    token: str | None = None
    # After a wrong admin token (the status page's sign-in, a bearer header), the same
    # address waits this long before its next try is looked at (429 meanwhile).
    failed_token_pause_s: float = 1.0

    def __repr__(self) -> str:  # never show the token
        return f"AdminConfig(host={self.host!r}, port={self.port}, token={'***' if self.token else None})"
