"""The gateway's listeners (HTTP, V2 gRPC, admin API): each named with the setting that moves
it, checked before any worker starts, and a failure to bind said as what to change.

A port another process holds is found here, before the worker pools start, so start-up fails
with one line naming the address and the flag or key to change, and no worker is started
only to be stopped again. The check binds each address as the listener will (SO_REUSEADDR,
which still refuses a port another socket listens on) and lets it go at once; a listener
that loses the port in between fails at its own bind with the same message.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from gateway.config import Config


@dataclass(frozen=True)
class Listener:
    what: str  # what listens there, as the messages name it
    host: str
    port: int
    setting: str  # the flag and config key that move it

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def failed(self, exc: OSError) -> str:
        """What went wrong binding it, and what to change."""
        code = exc.errno
        if code == errno.EADDRINUSE:
            why = "the port is in use by another process: stop that process, or choose another port"
            fix = f"with {self.setting} (0 picks a free one)"
        elif code == errno.EACCES:
            why = "permission denied (ports below 1024 need privileges): choose another port"
            fix = f"with {self.setting}"
        elif code == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
            why = f"{self.host} is not an address of this machine: choose another"
            fix = "with --host or gateway.host" if self.what != "admin API" else "with admin.host"
        else:
            why = "choose another address"
            fix = f"with {self.setting}"
        reason = exc.strerror or str(exc)
        return f"cannot listen on {self.address} for the {self.what}: {reason}; {why} {fix}"


def listeners(cfg: Config) -> list[Listener]:
    """Every listener the gateway opens with this config, in the order it opens them."""
    gw = cfg.gateway
    out = [Listener("HTTP endpoint", gw.host, gw.port, "--port or gateway.port")]
    if gw.grpc_port:
        out.append(Listener("V2 gRPC endpoint", gw.host, gw.grpc_port, "--grpc-port or gateway.grpc_port"))
    if cfg.admin is not None:
        out.append(Listener("admin API", cfg.admin.host, cfg.admin.port, "admin.port"))
    return out


def _probe(listener: Listener) -> None:
    """Bind every address the listener's host resolves to, as asyncio's server does; OSError if one fails."""
    infos = socket.getaddrinfo(
        listener.host or None, listener.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    for family, kind, proto, _, address in {(i[0], i[1], i[2], i[3], i[4]) for i in infos}:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(1)


def first_unavailable(cfg: Config) -> str | None:
    """The message for the first listener that cannot bind now; None when all can."""
    for listener in listeners(cfg):
        try:
            _probe(listener)
        except OSError as exc:
            return listener.failed(exc)
    return None


__all__ = ["Listener", "first_unavailable", "listeners"]
