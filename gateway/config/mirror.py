"""A service's mirror: a share of its calls copied to another version of its model or to
another service, whose answers are discarded (gateway.core.mirror sends them).

``mirror: {version: 2, percent: 10, max_in_flight: 8}`` or ``mirror: {service: shadow}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.config.values import ConfigError, check_keys

_KEYS = ("version", "service", "percent", "max_in_flight")


@dataclass(frozen=True)
class MirrorConfig:
    # Exactly one: a version of the service's own model, or another service by name.
    version: str | None = None
    service: str | None = None
    # The share of the service's calls copied, in percent (0 to 100, fractions allowed).
    percent: float = 100.0
    # Copies running at once; past it a copy is shed (counted, never queued).
    max_in_flight: int = 8


def parse_mirror(raw: Any, versions: Sequence[str], where: str) -> MirrorConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, e.g. {{version: 2, percent: 10}}")
    check_keys(raw, set(_KEYS), where)
    if ("version" in raw) == ("service" in raw):
        raise ConfigError(f"{where}: give either version (one of this service's) or service (another one)")
    version = service = None
    if "version" in raw:
        version = str(raw["version"]).strip()
        if version not in versions or len(versions) < 2:
            served = ", ".join(versions) if len(versions) > 1 else "one version only"
            raise ConfigError(
                f"{where}.version: {version[:32]!r} is not a version this service serves ({served})"
            )
    else:
        service = raw["service"]
        if not isinstance(service, str) or not service:
            raise ConfigError(f"{where}.service: expected the name of another service")
    percent = raw.get("percent", 100)
    if isinstance(percent, bool) or not isinstance(percent, int | float) or not 0 <= percent <= 100:
        raise ConfigError(f"{where}.percent: expected a number from 0 to 100, got {percent!r}")
    most = raw.get("max_in_flight", 8)
    if isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= 10_000:
        raise ConfigError(f"{where}.max_in_flight: expected a whole number from 1 to 10000, got {most!r}")
    return MirrorConfig(version, service, float(percent), most)


def mirror_problems(services: Sequence[Any]) -> list[str]:
    """A mirror naming a service that is not configured, or the service itself."""
    out = []
    names = {s.name for s in services}
    for i, svc in enumerate(services):
        mirror = svc.mirror
        if mirror is None or mirror.service is None:
            continue
        if mirror.service == svc.name:
            out.append(f"services[{i}] ({svc.name}).mirror.service: a service cannot mirror itself")
        elif mirror.service not in names:
            out.append(f"services[{i}] ({svc.name}).mirror.service: no service named {mirror.service[:64]!r}")
    return out


def mirror_doc(mirror: MirrorConfig) -> dict[str, Any]:
    """The mirror as the config file writes it."""
    target = {"version": int(mirror.version)} if mirror.version is not None else {"service": mirror.service}
    return {**target, "percent": mirror.percent, "max_in_flight": mirror.max_in_flight}


__all__ = ["MirrorConfig", "mirror_doc", "mirror_problems", "parse_mirror"]
