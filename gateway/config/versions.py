"""Model versions: the services behind a service that lists several versions of its model.

A service with ``versions: {1: a.onnx, 2: b.onnx}`` (gateway.config) serves its latest
version itself, under its own name and pool; every older version is a copy of the service
with that version's model, under a name no request path can reach, given a worker pool of
its own by the application factory. The V2 routes map a version to the service serving it.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.config import ServiceConfig


def version_key(name: str, version: str) -> str:
    """The name a service's older model version is served under, apart from its latest: never
    a valid service name (``@``), so no request path can name it."""
    return f"{name}@{version}"


def served_version(svc: ServiceConfig) -> str:
    """The version a service from :func:`version_services` serves: an older one's from its
    name, else the service's latest."""
    _, _, version = svc.name.partition("@")
    return version or svc.version_names[-1]


def version_services(svc: ServiceConfig) -> dict[str, ServiceConfig]:
    """Version -> the service that serves it: the latest is ``svc`` itself (its name, its
    workers), every older one a copy of ``svc`` under :func:`version_key` with that version's
    model, given a worker pool of its own."""
    if not svc.versions:
        return {"1": svc}
    latest = svc.versions[-1][0]
    return {
        v: svc
        if v == latest
        else replace(svc, name=version_key(svc.name, v), model=path, versions=(), traffic=(), async_=False)
        for v, path in svc.versions
    }


__all__ = ["served_version", "version_key", "version_services"]
