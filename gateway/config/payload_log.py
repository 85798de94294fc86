"""A service's payload log: which share of its calls has its request and answer written,
where, and how much of each body (``payload_log:`` in a service; docs/operations.md).

The sink is one of::

    file:///var/log/easkit/payloads.jsonl   a JSON-lines file, one CloudEvent a line
    http://collector:8080/events            each CloudEvent POSTed (structured mode)
    queue:NAME                              a record in the gateway's own queue service NAME

Credentials never go in the sink's text: an HTTP sink with a user or password in its URL is
refused (its collector is reached as is, or behind a proxy that adds them).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.config.values import ConfigError, as_float, as_int, check_keys

SINK_KINDS = ("file", "http", "queue")


@dataclass(frozen=True)
class PayloadLogConfig:
    sink: str
    # The share of calls logged, 0 to 1 (each call drawn at random).
    sample_rate: float = 1.0
    # Each body is cut to this many bytes (the event says it was cut).
    max_body_bytes: int = 64 * 1024

    @property
    def kind(self) -> str:
        """``file``, ``http`` or ``queue``."""
        if self.sink.startswith("queue:"):
            return "queue"
        return "file" if self.sink.startswith("file:") else "http"

    @property
    def target(self) -> str:
        """The file's path, the URL, or the queue's name."""
        if self.kind == "queue":
            return self.sink.partition(":")[2]
        if self.kind == "file":
            return urllib.parse.unquote(urllib.parse.urlsplit(self.sink).path)
        return self.sink


def parse_payload_log(raw: Any, where: str) -> PayloadLogConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping with sink, sample_rate and max_body_bytes")
    check_keys(dict(raw), {"sink", "sample_rate", "max_body_bytes"}, where)
    sink = raw.get("sink")
    if not isinstance(sink, str) or not sink:
        raise ConfigError(f"{where}.sink: required: file:///PATH, http(s)://HOST/PATH or queue:NAME")
    _check_sink(sink, f"{where}.sink")
    rate = as_float(raw.get("sample_rate", 1.0), f"{where}.sample_rate", lo=0.0)
    if rate > 1.0:
        raise ConfigError(f"{where}.sample_rate: the share of calls logged, from 0 to 1; got {rate:g}")
    limit = as_int(raw.get("max_body_bytes", 64 * 1024), f"{where}.max_body_bytes", lo=0, hi=16 << 20)
    return PayloadLogConfig(sink=sink, sample_rate=rate, max_body_bytes=limit)


def _check_sink(sink: str, where: str) -> None:
    if sink.startswith("queue:"):
        if not sink[len("queue:") :]:
            raise ConfigError(f"{where}: queue:NAME names a queue service of this gateway")
        return
    parts = urllib.parse.urlsplit(sink)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ConfigError(f"{where}: a file sink is file:///ABSOLUTE/PATH, got {sink[:80]!r}")
        return
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise ConfigError(f"{where}: an HTTP sink needs a host, got {sink[:80]!r}")
        if parts.username is not None or parts.password is not None:
            raise ConfigError(f"{where}: credentials do not belong in the sink's URL")
        return
    raise ConfigError(f"{where}: expected file:///PATH, http(s)://HOST/PATH or queue:NAME, got {sink[:80]!r}")


class _Service(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def processor(self) -> str: ...
    @property
    def payload_log(self) -> PayloadLogConfig | None: ...


def check_payload_sinks(services: Iterable[_Service]) -> list[str]:
    """A queue sink names a queue service of the same configuration: one error per service
    whose does not."""
    services = list(services)
    queues = {s.name for s in services if s.processor == "queue"}
    out = []
    for i, svc in enumerate(services):
        log = svc.payload_log
        if log is not None and log.kind == "queue" and log.target not in queues:
            out.append(f"services[{i}].payload_log.sink: no queue service named {log.target!r}")
    return out


__all__ = ["SINK_KINDS", "PayloadLogConfig", "check_payload_sinks", "parse_payload_log"]
