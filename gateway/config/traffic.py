"""A service's traffic split between its model versions: ``traffic: {1: 90, 2: 10}``.

Weights are whole percents that add up to 100; a version left out gets none of the calls
that do not name their version (a call that names one is served by it all the same). The
dataplane draws each call's version from the split (gateway.core.dataplane).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.config.values import ConfigError

# (version, percent) ascending by version; empty: the latest version takes every call.
Traffic = tuple[tuple[str, int], ...]


def parse_traffic(raw: Any, versions: Sequence[str], where: str) -> Traffic:
    """``{version: percent}`` -> the split, checked against the versions the service serves;
    ``where`` names the key in every error (``services[0] (m).traffic``)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: expected a mapping of versions to percents, e.g. {{1: 90, 2: 10}}")
    if len(versions) < 2:
        raise ConfigError(
            f"{where}: the service serves one version; list its versions (versions:) to split traffic"
        )
    out: dict[str, int] = {}
    for key, value in raw.items():
        version = str(key).strip()
        if version not in versions:
            raise ConfigError(
                f"{where}: version {version[:32]!r} is not one the service serves ({', '.join(versions)})"
            )
        if version in out:
            raise ConfigError(f"{where}: version {version} given twice")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
            raise ConfigError(f"{where}.{version}: expected a whole percent from 0 to 100, got {value!r}")
        out[version] = value
    total = sum(out.values())
    if total != 100:
        raise ConfigError(f"{where}: the percents add up to {total}, not 100")
    return tuple(sorted(out.items(), key=lambda kv: int(kv[0])))


def traffic_doc(traffic: Traffic) -> dict[int, int]:
    """The split as the config file writes it."""
    return {int(v): w for v, w in traffic}


__all__ = ["Traffic", "parse_traffic", "traffic_doc"]
