"""Service groups at run time (gateway.config.groups): one name in front of several services,
each taking a share of the calls to it.

The dataplane's ``find`` draws the member that runs a call to a group's name: the one place a
member is chosen, for every protocol that calls a service by its name (EAS predict, KServe V1
and V2 REST, V2 gRPC, Paddle, Cluster Serving). Every answer from a group's member names it
in :data:`MEMBER_HEADER` (gRPC: the trailing metadata), as every answer from a service with
versions names its version. A call to a name that is no group costs one failed dict lookup.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gateway.config.traffic import Traffic
from gateway.core import errors
from gateway.core.calls import WorkerResponse
from gateway.core.traffic import draw

MEMBER_HEADER = "X-Group-Member"


class ServiceGroups(dict[str, Traffic]):
    """Group name -> its split ``((member, percent), ...)``; ``members``: every service that is
    in some group (its answers carry :data:`MEMBER_HEADER`)."""

    def __init__(self, groups: Mapping[str, Traffic] | Iterable[tuple[str, Traffic]] = ()) -> None:
        super().__init__(groups)
        self.members = frozenset(m for split in self.values() for m, _ in split)

    def draw(self, name: str) -> str:
        """The member that runs one call to group ``name``, drawn with its share."""
        return draw(self[name])

    def member_names(self, name: str) -> tuple[str, ...]:
        """Group ``name``'s members in the order the configuration lists them."""
        return tuple(m for m, _ in self[name])

    def name_member(self, served: str, resp: WorkerResponse) -> None:
        """Name the member in an answer from ``served`` (a service, or one of its versions,
        ``name@version``) when it is in a group. The dataplane asks only for a name in
        ``members`` or a version's, so any other call pays a set lookup."""
        member = served if served in self.members else served.partition("@")[0]
        if member in self.members:
            resp.headers = {**(resp.headers or {}), MEMBER_HEADER: member}


def refuse_group(groups: ServiceGroups, name: str, what: str) -> None:
    """400 when ``name`` is a group: ``what`` is the call a group cannot take (a group has no
    workers of its own: direct-mode discovery, a remote worker's registration)."""
    if name in groups:
        raise errors.WrongServiceKind(
            f"{name!r} is a service group, which {what}: call the group through the gateway "
            f"(/api/predict/{name}), or name one of its members ({', '.join(groups.member_names(name))})"
        )


__all__ = ["MEMBER_HEADER", "ServiceGroups", "refuse_group"]
