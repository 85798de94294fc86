"""Service descriptions as the admin API and its store read and write them: the same schema
as the config file's ``services:`` entries, parsed by gateway.config."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any

from gateway.config import ConfigError, ServiceConfig, parse_service
from gateway.config.autoscale import autoscale_doc
from gateway.config.mirror import mirror_doc
from gateway.config.placement import placement_to_write
from gateway.config.traffic import traffic_doc

# Fields whose change reaches only the gateway side: applied without restarting workers.
IN_PLACE_FIELDS = frozenset({"workers", "timeout_ms", "max_pending", "autoscale"})
# Fields whose change reaches only the dataplane: the pools of every version serve on.
ROUTING_FIELDS = frozenset({"traffic", "mirror"})
REDACTED = "***"


def spec_of(svc: ServiceConfig, *, redact: bool = True) -> dict[str, Any]:
    """A ServiceConfig as a ``services:`` entry; tokens and ``env`` values shown as ``***``
    unless ``redact`` is False (the store keeps them, readable by the gateway's user only)."""
    out: dict[str, Any] = {"name": svc.name, "processor": svc.processor}
    defaults = ServiceConfig(name=svc.name, processor=svc.processor)
    for f in fields(ServiceConfig):
        key = f.name
        if key in ("name", "processor"):
            continue
        value = getattr(svc, key)
        if key == "placement":
            written = placement_to_write(value, svc.placement_reason, svc.processor)
            if written is not None:
                out[key] = written
            continue
        if key == "placement_reason" or value == getattr(defaults, key) or (key == "model" and svc.versions):
            continue
        if key == "token":
            out["token"] = REDACTED if redact else value
        elif key == "extra_tokens":
            out["tokens"] = [REDACTED] * len(value) if redact else list(value)
        elif key == "async_":
            out["async"] = value
        elif key in ("batching", "queue", "cluster_serving", "payload_log"):
            out[key] = asdict(value)
        elif key == "versions":  # the model is the latest version's: versions alone say it
            out.pop("model", None)
            out["versions"] = {int(v): path for v, path in value}
        elif key == "traffic":
            out["traffic"] = traffic_doc(value)
        elif key == "mirror":
            out["mirror"] = mirror_doc(value)
        elif key == "autoscale":
            out["autoscale"] = autoscale_doc(value)
        elif key == "remote_workers":
            out[key] = {**asdict(value), "token": REDACTED if redact else value.token}
        elif key == "env":
            out["env"] = dict.fromkeys(value, REDACTED) if redact else dict(value)
        elif key == "env_pass":  # passed through: null in the env mapping
            out["env"] = {**out.get("env", {}), **dict.fromkeys(value)}
        elif key == "providers":
            out["providers"] = list(value)
        elif key == "config":
            out["config"] = dict(value)
        elif key == "inputs":  # declared tensors, as the file writes them
            out["inputs"] = {
                d.name: {
                    k: v
                    for k, v in (("dtype", d.dtype), ("shape", d.shape and list(d.shape)))
                    if v is not None
                }
                for d in value
            }
        else:
            out[key] = value
    return out


def parse_body(body: bytes, content_type: str) -> Any:
    """A request body in JSON or YAML (a YAML document may hold JSON too)."""
    if not body.strip():
        raise ConfigError("service: the body is empty; send a service description in JSON or YAML")
    if "json" in content_type:
        try:
            return json.loads(body)
        except ValueError as exc:
            raise ConfigError(f"service: the body is not valid JSON: {exc}") from None
    import yaml

    try:
        return yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise ConfigError(f"service: the body is not valid YAML or JSON: {exc}") from None


def parse_spec(raw: Any) -> ServiceConfig:
    """A service description -> ServiceConfig, refusing what the manager cannot run."""
    svc = parse_service(raw)
    if svc.processor in ("queue", "pipeline") or svc.async_:
        raise ConfigError(
            f"service ({svc.name}): queue, asynchronous and pipeline services are configured in the file"
        )
    return svc


def changed_fields(old: ServiceConfig, new: ServiceConfig) -> set[str]:
    return {f.name for f in fields(ServiceConfig) if getattr(old, f.name) != getattr(new, f.name)}


__all__ = [
    "IN_PLACE_FIELDS",
    "REDACTED",
    "ROUTING_FIELDS",
    "changed_fields",
    "parse_body",
    "parse_spec",
    "spec_of",
]
