"""What the sync and asyncio transports share: URL splitting, TLS contexts, idle expiry."""

from __future__ import annotations

import ssl
import threading
import weakref
from typing import Generic, NamedTuple, Protocol, TypeVar

# Idle keep-alive connections are dropped after this long (below the 75 s of
# aiohttp servers, above the 5 s of uvicorn; a stale one is re-sent anyway).
DEFAULT_KEEPALIVE_EXPIRY = 10.0
DEFAULT_MAX_CONNECTIONS = 100
# Pools (endpoints) a transport keeps; the oldest is closed when a new one would pass this.
MAX_POOLS = 64

# Bodies up to this size go out joined with the request head in one send; a
# larger one is sent on its own rather than copied.
COALESCE_MAX_BODY = 64 * 1024

RECV_SIZE = 262144


class Origin(NamedTuple):
    """Where connections go: scheme, host, port, and the Host header's value."""

    scheme: str
    host: str
    port: int
    host_header: bytes

    @property
    def tls(self) -> bool:
        return self.scheme == "https"


def split_url(url: str) -> tuple[str, str]:
    """``(origin, target)``: ``http://h:1/p?q`` -> ``('http://h:1', '/p?q')``.

    Cheaper than ``urlsplit`` and enough for the absolute URLs the SDK builds; the
    origin is parsed (and checked) once per pool by :func:`parse_origin`.
    """
    start = url.find("://")
    if start <= 0:
        raise ValueError(f"not an absolute http(s) URL: {url[:100]!r}")
    slash = url.find("/", start + 3)
    if slash < 0:
        query = url.find("?", start + 3)
        if query < 0:
            return url, "/"
        return url[:query], "/" + url[query:]
    return url[:slash], url[slash:]


def parse_origin(origin: str) -> Origin:
    """``http://host:port`` (or https) as an :class:`Origin`; ValueError when it is not one."""
    scheme, _, authority = origin.partition("://")
    scheme = scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"unsupported URL scheme {scheme!r}")
    if "@" in authority:
        raise ValueError("credentials in the URL are not supported")
    default = 443 if scheme == "https" else 80
    if authority.startswith("["):  # an IPv6 literal
        end = authority.find("]")
        if end < 0:
            raise ValueError(f"bad IPv6 address in {origin!r}")
        host, rest = authority[1:end], authority[end + 1 :]
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = authority.partition(":")
    if not host:
        raise ValueError(f"no host in URL {origin!r}")
    try:
        port = int(port_text) if port_text else default
    except ValueError:
        raise ValueError(f"bad port in URL {origin!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad port in URL {origin!r}")
    shown = f"[{host}]" if ":" in host else host
    header = shown if port == default else f"{shown}:{port}"
    return Origin(scheme, host, port, header.encode("idna" if not header.isascii() else "ascii"))


# A client certificate for a server that asks for one (mTLS): a PEM file holding the
# certificate and its key, or (certificate file, key file).
ClientCert = str | tuple[str, str]


def tls_context(ca_certs: str | None, client_cert: ClientCert | None = None) -> ssl.SSLContext:
    """A verifying client context: the system CAs, or the PEM bundle ``ca_certs`` instead;
    presenting ``client_cert`` when given."""
    ctx = ssl.create_default_context(cafile=ca_certs)
    if client_cert is not None:
        cert, key = (client_cert, None) if isinstance(client_cert, str) else client_cert
        ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class _Clearable(Protocol):
    def clear(self) -> None: ...


P = TypeVar("P", bound=_Clearable)


class PoolSet(Generic[P]):
    """A transport's settings and its pools, one per endpoint, sync or asyncio alike."""

    def __init__(
        self,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        keepalive_expiry: float = DEFAULT_KEEPALIVE_EXPIRY,
        ca_certs: str | None = None,
        client_cert: ClientCert | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self.ca_certs = ca_certs
        self.client_cert = client_cert
        self._tls: ssl.SSLContext | None = None
        self._pools: dict[str, P] = {}
        # Guards the pool table where threads share a transport (the sync one).
        self._lock = threading.Lock()

    def _make_pool(self, origin: Origin, tls: ssl.SSLContext | None) -> P:
        raise NotImplementedError

    def _add_pool(self, origin_text: str) -> P:
        """A new pool for ``origin_text``; the oldest is closed past MAX_POOLS (direct-mode
        endpoints come and go)."""
        origin = parse_origin(origin_text)
        tls = None
        if origin.tls:
            if self._tls is None:
                self._tls = tls_context(self.ca_certs, self.client_cert)
            tls = self._tls
        pool = self._make_pool(origin, tls)
        if len(self._pools) >= MAX_POOLS:
            self._pools.pop(next(iter(self._pools))).clear()
        self._pools[origin_text] = pool
        return pool


class _Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


def close_all(conns: list[C]) -> None:
    for conn in conns:
        conn.close()


class PoolBase(Generic[C]):
    """What a sync and an asyncio pool of connections to one origin both keep."""

    def __init__(self, origin: Origin, expiry: float, tls: ssl.SSLContext | None) -> None:
        self.origin = origin
        self.expiry = expiry
        self.tls = tls
        self._idle: list[C] = []
        self.closed = False  # set by clear(): a connection coming back is closed, not kept
        # A pool dropped without clear() (an abandoned client) still closes its sockets.
        weakref.finalize(self, close_all, self._idle)
