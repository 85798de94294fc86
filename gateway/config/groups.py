"""Service groups: one name in front of several services, each taking a share of its calls
(EAS's service groups): ``groups: {digits: {digits-a: 70, digits-b: 30}}``.

A call to the group's name (EAS predict, KServe V1 and V2, V2 gRPC, Paddle, Cluster Serving)
runs on one member, drawn with its share (gateway.core.groups); it is checked against that
member's tokens and counted in its metrics. A member is a model, or a python service, never
a queue, an asynchronous service or a pipeline.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gateway.config.traffic import Traffic
from gateway.config.values import ConfigError

Groups = tuple[tuple[str, Traffic], ...]


def parse_groups(raw: Any, services: Sequence[Any], name_re: re.Pattern[str]) -> Groups:
    """``{group: {service: percent}}`` -> the groups, checked against the services (each error
    names its key: ``groups.digits.digits-c``)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ConfigError("groups: expected a mapping of group names to {service: percent}")
    by_name = {s.name: s for s in services}
    out = []
    for group, members in raw.items():
        where = f"groups.{group}"
        if not isinstance(group, str) or not name_re.fullmatch(group):
            raise ConfigError(f"{where}: a group name must match {name_re.pattern}")
        if group in by_name:
            raise ConfigError(f"{where}: a service is named {group!r} too; a group needs a name of its own")
        if not isinstance(members, dict) or not members:
            raise ConfigError(f"{where}: expected a mapping of services to percents, e.g. {{a: 70, b: 30}}")
        split = []
        for member, percent in members.items():
            svc = by_name.get(member)
            if svc is None:
                raise ConfigError(f"{where}.{member}: no service named {str(member)[:64]!r}")
            if svc.processor == "queue" or svc.async_:
                raise ConfigError(f"{where}.{member}: a queue or asynchronous service cannot be in a group")
            if svc.processor == "pipeline":
                raise ConfigError(
                    f"{where}.{member}: a pipeline cannot be in a group; split the calls of the "
                    "services its steps call instead (their versions' traffic)"
                )
            if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
                raise ConfigError(
                    f"{where}.{member}: expected a whole percent from 0 to 100, got {percent!r}"
                )
            split.append((member, percent))
        total = sum(p for _, p in split)
        if total != 100:
            raise ConfigError(f"{where}: the percents add up to {total}, not 100")
        out.append((group, tuple(split)))
    return tuple(out)


__all__ = ["Groups", "parse_groups"]
