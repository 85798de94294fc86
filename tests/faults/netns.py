"""Network namespaces the fault suite makes for itself: one "host" per namespace, joined by
veth pairs to a bridge in a hub namespace, on a private /24 that exists nowhere else.

Nothing is created in the root namespace: each veth pair is made with both ends already
in their namespaces, so deleting the namespaces removes every link, address, nft rule and
qdisc with them. Names carry the creating process's pid (``fzt<pid>-<host>``), so a run
can remove what a killed earlier run left (``remove_stale``) without touching the
namespaces of a run still going in another process.

Faults are applied inside the hosts' namespaces:
* a partition drops packets with nft in the two hosts' own input and output hooks;
* packet loss is an nft ``numgen random`` drop for the traffic with one peer;
* a host cut off entirely has its veth set down;
* a slow link is a ``tbf`` rate limit (the kernel here has no ``netem``: a fixed delay is
  not available, a rate limit gives queueing delay under load instead).

A name that resolves to several hosts (the remote worker's ``--gateway``, as a Kubernetes
headless Service does) is a hosts file in ``/etc/netns/<namespace>/``, which ``ip netns
exec`` mounts over ``/etc/hosts`` for the programs it starts; ``close()`` removes it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "fzt"
ETC = Path("/etc/netns")
SUBNET = "10.231.0"
_NAME = re.compile(rf"^{PREFIX}(\d+)-\S+$")


class NetnsUnavailable(RuntimeError):
    """Raised when namespaces cannot be made here (not root, no iproute2 or nft)."""


def _run(argv: Sequence[str], timeout: float = 10.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=check)


def why_unavailable() -> str | None:
    """Why this machine cannot run the suite, or None when it can."""
    if os.geteuid() != 0:
        return "the fault suite across hosts needs root (ip netns, nft)"
    for tool in ("ip", "nft", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup.sh installs iproute2 and nftables)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _run(["ip", "netns", "add", probe])
    except (subprocess.SubprocessError, OSError) as exc:
        return f"ip netns is not available here: {getattr(exc, 'stderr', '') or exc}"
    try:
        res = _run(["ip", "netns", "exec", probe, "nft", "add", "table", "inet", "probe"], check=False)
        if res.returncode != 0:
            return f"nft does not work in a network namespace here: {res.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_namespaces() -> list[str]:
    res = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def kill_inside(ns: str) -> None:
    """SIGKILL every process still in ``ns``: a process inside keeps a deleted namespace alive."""
    res = _run(["ip", "netns", "pids", ns], check=False)
    for pid in res.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)


def remove_stale() -> list[str]:
    """Remove the namespaces of suite runs whose process is gone; returns their names."""
    removed = []
    for ns in list_namespaces():
        m = _NAME.match(ns)
        if m is None:
            continue
        owner = int(m.group(1))
        if owner != os.getpid() and _pid_alive(owner):
            continue  # a run still going in another process
        kill_inside(ns)
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    for etc in ETC.glob(f"{PREFIX}*") if ETC.is_dir() else []:
        m = _NAME.match(etc.name)
        if m is not None and (int(m.group(1)) == os.getpid() or not _pid_alive(int(m.group(1)))):
            _remove_etc(etc)
    return removed


def _remove_etc(path: Path) -> None:
    """A namespace's /etc overlay, and /etc/netns itself once no namespace has one."""
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        ETC.rmdir()  # only when empty: another program's overlays stay


@dataclass
class Host:
    name: str  # short, e.g. "gw1"
    ns: str  # the namespace
    ip: str
    link: str  # its end of the veth pair, inside ns
    hub_link: str  # the other end, in the hub


@dataclass
class Network:
    """The hub and the hosts of one run; ``close()`` removes them all (idempotent)."""

    hosts: dict[str, Host] = field(default_factory=dict)
    hub: str = ""
    _closed: bool = False

    @classmethod
    def create(cls, names: Iterable[str]) -> Network:
        pid = os.getpid()
        net = cls(hub=f"{PREFIX}{pid}-hub")
        try:
            _run(["ip", "netns", "add", net.hub])
            net._in(net.hub, "ip", "link", "add", "br0", "type", "bridge")
            net._in(net.hub, "ip", "link", "set", "br0", "up")
            for i, name in enumerate(names, start=10):
                ns = f"{PREFIX}{pid}-{name}"
                _run(["ip", "netns", "add", ns])
                host = Host(name, ns, f"{SUBNET}.{i}", "eth0", f"v{i}")
                net.hosts[name] = host
                _run([
                    "ip", "link", "add", "eth0", "netns", ns, "type", "veth",
                    "peer", "name", host.hub_link, "netns", net.hub,
                ])  # fmt: skip
                net._in(net.hub, "ip", "link", "set", host.hub_link, "master", "br0", "up")
                net._in(ns, "ip", "addr", "add", f"{host.ip}/24", "dev", "eth0")
                net._in(ns, "ip", "link", "set", "eth0", "up")
                net._in(ns, "ip", "link", "set", "lo", "up")
                # One table per host for every fault: healing is a flush of its chains.
                net._nft(name, "add table inet fz")
                net._nft(name, "add chain inet fz in { type filter hook input priority 0 ; }")
                net._nft(name, "add chain inet fz out { type filter hook output priority 0 ; }")
        except BaseException:
            net.close()
            raise
        return net

    # ------------------------------------------------------------------ commands
    def _in(self, ns: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return _run(["ip", "netns", "exec", ns, *argv])

    def _nft(self, host: str, rule: str) -> None:
        self._in(self.hosts[host].ns, "nft", rule)

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace (same pid: ``ip netns exec`` execs it)."""
        return ["ip", "netns", "exec", self.hosts[host].ns, *argv]

    def ip(self, host: str) -> str:
        return self.hosts[host].ip

    def resolve(self, host: str, name: str, targets: Sequence[str]) -> None:
        """Make ``name`` resolve to every host of ``targets`` for programs started in ``host``."""
        etc = ETC / self.hosts[host].ns
        etc.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", *(f"{self.ip(t)} {name}" for t in targets)]
        (etc / "hosts").write_text("\n".join(lines) + "\n", encoding="utf-8")
        # glibc answers one address per name from a hosts file unless told otherwise.
        (etc / "host.conf").write_text("multi on\n", encoding="utf-8")

    def curl(self, host: str, url: str, timeout: float = 2.0) -> tuple[int, str]:
        """One GET from inside ``host``: (status, body), status 0 when no answer came."""
        res = _run(
            self.exec_argv(host, ["curl", "-s", "-m", str(timeout), "-w", "\n%{http_code}", url]),
            timeout=timeout + 5,
            check=False,
        )
        body, _, code = res.stdout.rpartition("\n")
        return (int(code) if code.isdigit() else 0), body

    # ------------------------------------------------------------------ faults
    def partition(self, a: str, b: str) -> None:
        """Drop every packet between hosts ``a`` and ``b`` (both directions, at both ends)."""
        for me, peer in ((a, b), (b, a)):
            self._nft(me, f"add rule inet fz in ip saddr {self.ip(peer)} drop")
            self._nft(me, f"add rule inet fz out ip daddr {self.ip(peer)} drop")

    def lossy(self, a: str, b: str, percent: int) -> None:
        """Drop ``percent`` % of the packets between ``a`` and ``b`` at random, each way."""
        for me, peer in ((a, b), (b, a)):
            self._nft(
                me, f"add rule inet fz in ip saddr {self.ip(peer)} numgen random mod 100 < {percent} drop"
            )
            self._nft(
                me, f"add rule inet fz out ip daddr {self.ip(peer)} numgen random mod 100 < {percent} drop"
            )

    def slow(self, host: str, rate: str = "256kbit") -> None:
        """Rate-limit ``host``'s link (queueing delay under load; no netem in this kernel)."""
        self._in(
            self.hosts[host].ns, "tc", "qdisc", "replace", "dev", "eth0", "root",
            "tbf", "rate", rate, "burst", "16kbit", "latency", "500ms",
        )  # fmt: skip

    def isolate(self, host: str) -> None:
        """Cut ``host`` off from every other host: its veth down at the hub."""
        self._in(self.hub, "ip", "link", "set", self.hosts[host].hub_link, "down")

    def heal(self) -> None:
        """Undo every fault: rules flushed, links up, qdiscs removed."""
        for name, host in self.hosts.items():
            self._nft(name, "flush chain inet fz in")
            self._nft(name, "flush chain inet fz out")
            self._in(self.hub, "ip", "link", "set", host.hub_link, "up")
            _run(self.exec_argv(name, ["tc", "qdisc", "del", "dev", "eth0", "root"]), check=False)

    def rules(self) -> str:
        """Every host's nft rules, for a report or a leak check."""
        out = []
        for name in self.hosts:
            res = _run(self.exec_argv(name, ["nft", "list", "table", "inet", "fz"]), check=False)
            out.append(f"{name}: {res.stdout.strip()}")
        return "\n".join(out)

    # ------------------------------------------------------------------ cleanup
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ns in [h.ns for h in self.hosts.values()] + ([self.hub] if self.hub else []):
            if ns in list_namespaces():
                kill_inside(ns)
                _run(["ip", "netns", "del", ns], check=False)
            if (ETC / ns).exists():
                _remove_etc(ETC / ns)
