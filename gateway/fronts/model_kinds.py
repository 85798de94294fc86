"""Which services the model protocols (KServe V1/V2 REST, V2 gRPC, Triton's clients) serve
as models, and which of them explain.

A model service (onnx and the other runtimes) and a pipeline always are. A ``python`` service
is one once its workers said it declares its inputs, or that it is an existing
``kserve.Model`` (docs/processors.md); until a worker has been ready nothing is known, so it
is named like a model that is not ready yet (503) but not listed, and one that declares
nothing is refused with what to add. One place for the REST routes, the
gRPC servicer and the lean front alike.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config import ServiceConfig
from gateway.config.catalog import MODEL_PROCESSORS
from gateway.core import errors
from gateway.core.backend import ServiceBackend
from gateway.core.groups import ServiceGroups
from gateway.core.metadata import KSERVE_PLATFORM, ModelMetadata

# Kinds whose calls are tensors by nature.
TENSOR_KINDS = (*MODEL_PROCESSORS, "pipeline")
# User code: a model when it declares its tensors.
USER_CODE = "python"


def is_model(svc: ServiceConfig, backends: Mapping[str, ServiceBackend]) -> bool:
    """Whether the model protocols list and name ``svc``: user code once its workers said it
    declares its tensors."""
    backend = backends.get(svc.name)
    if backend is None:
        return False
    if svc.processor in TENSOR_KINDS:
        return True
    meta = backend.metadata
    return svc.processor == USER_CODE and meta is not None and (meta.tensors or as_it_came(meta))


def as_it_came(meta: ModelMetadata | None) -> bool:
    """Whether the model is an existing ``kserve.Model``: its V1 calls reach it as they came."""
    return meta is not None and meta.platform == KSERVE_PLATFORM


def check_served(svc: ServiceConfig, backends: Mapping[str, ServiceBackend], name: str) -> None:
    """For user code that is not (yet) a model: 503 while no worker of it has said what it
    declares, 404 naming what is missing when it declares no tensors; else nothing."""
    backend = backends.get(svc.name)
    if svc.processor != USER_CODE or backend is None:
        return
    meta = backend.metadata
    if meta is None:
        raise errors.ServiceNotReady(f"model {name!r} is not ready: no worker of it has been ready yet")
    if not meta.tensors and not as_it_came(meta):
        raise errors.NotFound(
            f"model {name!r} is not served over V2: declare inputs/outputs (a metadata() method, "
            "or inputs and outputs beside predict(inputs); docs/processors.md)"
        )


def not_served(svc: ServiceConfig, name: str) -> str:
    """What a V2 call (REST or gRPC) naming a service of a kind with no V2 form is told: that,
    and what reaches it, rather than that the model does not exist."""
    use = "its queue: POST /api/predict/" if svc.processor == "queue" else "EAS: POST /api/predict/"
    return f"model {name!r} is not served over V2: it is a {svc.processor} service; call it over {use}{name}"


def group_models(
    groups: ServiceGroups,
    services: Mapping[str, ServiceConfig],
    backends: Mapping[str, ServiceBackend],
    name: str,
    version: str | None = None,
) -> tuple[ServiceConfig, ...] | None:
    """A service group's members as the model protocols serve them; None when ``name`` is no
    group. Every member must be a model (else the error naming the member and why, whichever
    member a call would land on), and a group has no versions of its own (``version``: the
    one a path names). The core draws the member that runs each call (``DataPlane.find``)."""
    split = groups.get(name)
    if split is None:
        return None
    if version:
        raise errors.NotFound(
            f"model {name!r} is a service group: it has no version {version[:32]!r} of its own; "
            "name the version with X-Model-Version, or call a member "
            f"({', '.join(groups.member_names(name))})"
        )
    members = []
    for member, _ in split:
        svc = services.get(member)
        if svc is None or member not in backends:
            raise errors.ServiceNotFound(f"service group {name!r}: its member {member!r} is not served now")
        try:
            check_served(svc, backends, member)
        except errors.GatewayError as exc:  # the same error, saying which group it is about
            exc.message = f"service group {name!r}: {exc.message}"
            exc.args = (exc.message,)
            raise
        if not is_model(svc, backends):
            raise errors.ServiceNotFound(f"service group {name!r}: {not_served(svc, member)}")
        members.append(svc)
    return tuple(members)


def agreed(name: str, answers: Mapping[str, bytes], what: str) -> bytes:
    """The answer every member of group ``name`` gives (each written under the group's name),
    else 409 naming the members: a group answers for its members only when they agree."""
    distinct = set(answers.values())
    if len(distinct) == 1:
        return distinct.pop()
    raise errors.Conflict(
        f"service group {name!r}: its members ({', '.join(answers)}) differ in their {what}; "
        "ask a member by its name"
    )


__all__ = [
    "TENSOR_KINDS",
    "USER_CODE",
    "agreed",
    "as_it_came",
    "check_served",
    "group_models",
    "is_model",
    "not_served",
]
