"""Two listeners of one gateway on one port: a config error naming both settings, found when
the file is read (``eas-gateway validate`` too) rather than when the second one fails to bind.

The listeners: the HTTP endpoint (``gateway.port``), the V2 gRPC endpoint
(``gateway.grpc_port``, on the same host), the admin API (``admin.port`` on ``admin.host``) and
each service's Paddle pipeline port (``rpc_port``, on the gateway's host).
Port 0 (any free port) never clashes. Two hosts clash when they are the same address, or one
of them is every address (``0.0.0.0``, ``::``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Listen addresses meaning "every interface": compared against, never bound here.
_EVERY_ADDRESS = ("0.0.0.0", "::", "")  # noqa: S104 - values to recognise, not a bind
_SAME = {"localhost": "127.0.0.1"}


def _overlap(a: str, b: str) -> bool:
    a, b = _SAME.get(a, a), _SAME.get(b, b)
    return a == b or a in _EVERY_ADDRESS or b in _EVERY_ADDRESS


def port_clashes(
    gateway: Any, admin: Any, names: Mapping[str, str] | None = None, services: Sequence[Any] = ()
) -> list[str]:
    """One error per pair of listeners on one port. ``gateway``: a GatewayConfig; ``admin``: an
    AdminConfig or None; ``names``: how to name a setting where it came from elsewhere (a flag);
    ``services``: ServiceConfigs, whose ``rpc_port`` listens too."""
    names = names or {}
    listeners = [
        ("gateway.port", gateway.host, gateway.port),
        ("gateway.grpc_port", gateway.host, gateway.grpc_port),
    ]
    if admin is not None:
        listeners.append(("admin.port", admin.host, admin.port))
    listeners += [(f"services ({s.name}).rpc_port", gateway.host, s.rpc_port) for s in services if s.rpc_port]
    out = []
    for i, (key_a, host_a, port_a) in enumerate(listeners):
        for key_b, host_b, port_b in listeners[i + 1 :]:
            if port_a and port_a == port_b and _overlap(host_a, host_b):
                a, b = names.get(key_a, key_a), names.get(key_b, key_b)
                out.append(f"{a} and {b} are both {port_a}: each listener needs a port of its own")
    return out


__all__ = ["port_clashes"]
