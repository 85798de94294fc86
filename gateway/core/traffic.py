"""Which version of a service a call runs on: the one it names, else one drawn from the
service's traffic split (gateway.config.traffic), else the latest.

A call names its version by its path (V2's ``/versions/N``, gRPC's ``model_version``) or by
the :data:`VERSION_HEADER` request header (every other protocol); every answer from a
service with versions carries the version that served it in the same header.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from gateway.config import ServiceConfig
from gateway.config.traffic import Traffic
from gateway.config.versions import version_key
from gateway.core import errors

VERSION_HEADER = "X-Model-Version"


def draw(traffic: Traffic) -> str:
    """A version drawn with its share of the split (the percents add up to 100)."""
    # Not a secret: a fair draw is all that is needed, so the fast generator serves.
    point = random.random() * 100.0
    for version, percent in traffic:
        point -= percent
        if point < 0.0:
            return version
    return next(v for v, w in reversed(traffic) if w)  # only float rounding lands here


def route(
    svc: ServiceConfig,
    headers: Mapping[str, str],
    services: Mapping[str, ServiceConfig],
    served: Mapping[str, object],
) -> ServiceConfig:
    """The service that runs a call to ``svc`` (itself for its latest version, else the copy
    serving an older one, gateway.config.versions): the version :data:`VERSION_HEADER` names
    (404 for one it does not serve), else one drawn from its traffic split, else the latest.
    ``services``: the dataplane's table; ``served``: the names that have a backend now."""
    if not svc.versions:
        return svc
    asked = headers.get(VERSION_HEADER)
    if asked is None and type(headers) is dict:  # a record's own headers, as they were sent
        asked = {k.lower(): v for k, v in headers.items()}.get("x-model-version")
    if asked is not None:
        version = asked.strip()
        if version not in svc.version_names:
            raise errors.NotFound(
                f"service {svc.name!r} has no version {version[:32]!r} ({VERSION_HEADER}); "
                f"it serves {', '.join(svc.version_names)}"
            )
    elif svc.traffic:
        version = draw(svc.traffic)
    else:
        return svc
    if version == svc.version_names[-1]:
        return svc
    runs = services.get(version_key(svc.name, version))
    if runs is None or runs.name not in served:
        raise errors.ServiceNotFound(f"service {svc.name!r}: version {version} is not served now")
    return runs


__all__ = ["VERSION_HEADER", "draw", "route"]
