"""TLS for the gateway's listeners and its link to remote workers: ``ssl.SSLContext`` from a
:class:`~gateway.config.tls.TlsConfig`, and its files loaded again on SIGHUP.

A listener keeps one context for its whole life, which hands every new handshake the
context loaded last: a reload replaces the certificate, the key and the client CA bundle as
a whole (a CA taken out of the bundle is no longer trusted), while connections already open
keep the session they have (nothing is dropped). A client (the gateway's side of its link to
remote workers, a remote worker's registrations) takes :attr:`ClientTls.context` for each
new connection. The new files are first loaded into a throw-away context, so a reload with a
broken or mismatched pair changes nothing and says why.
"""

from __future__ import annotations

import logging
import socket
import ssl
from pathlib import Path
from typing import Any

from gateway.config.tls import TlsConfig

log = logging.getLogger("gateway.tls")

_VERIFY = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class TlsError(Exception):
    """Certificate or key files that do not load (the message names the files, never their text)."""


def _server_context(
    cfg: TlsConfig, alpn: tuple[str, ...], ctx: ssl.SSLContext | None = None
) -> ssl.SSLContext:
    """``ctx`` (default: a new context) set up as a server of ``cfg``'s files."""
    if ctx is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(ctx, cfg)
    ctx.verify_mode = _VERIFY[cfg.client_auth]
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


def _load(ctx: ssl.SSLContext, cfg: TlsConfig) -> None:
    try:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        if cfg.client_ca_file:
            ctx.load_verify_locations(cfg.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(f for f in (cfg.cert_file, cfg.key_file, cfg.client_ca_file) if f)
        raise TlsError(f"TLS files {files} do not load: {getattr(exc, 'reason', None) or exc}") from None


class _Handover(ssl.SSLContext):
    """What a listener is given: each new connection is wrapped by ``current``, the context
    loaded last (asyncio and uvloop wrap every accepted connection with ``wrap_bio``), so a
    reload never touches a context a connection already uses. Its own settings are those of
    the first files, for whoever reads them."""

    current: ssl.SSLContext

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return self.current.wrap_bio(incoming, outgoing, server_side, server_hostname, session)

    def wrap_socket(self, sock: socket.socket, *args: Any, **kwargs: Any) -> ssl.SSLSocket:  # type: ignore[override]
        return self.current.wrap_socket(sock, *args, **kwargs)


class ServerTls:
    """One listener's TLS: ``context`` for its whole life, ``reload`` on SIGHUP."""

    def __init__(self, cfg: TlsConfig, alpn: tuple[str, ...] = ("http/1.1",)) -> None:
        self.cfg = cfg
        self.alpn = alpn
        self._handover = _Handover(ssl.PROTOCOL_TLS_SERVER)
        _server_context(cfg, alpn, self._handover)
        self._handover.current = _server_context(cfg, alpn)
        self.context: ssl.SSLContext = self._handover

    def read_files(self) -> tuple[bytes, bytes, bytes | None]:
        """(certificate chain, key, client CA bundle) as bytes, for runtimes that take PEM
        bytes rather than a context (gRPC)."""
        ca = Path(self.cfg.client_ca_file).read_bytes() if self.cfg.client_ca_file else None
        return Path(self.cfg.cert_file).read_bytes(), Path(self.cfg.key_file).read_bytes(), ca

    def reload(self) -> None:
        """Load the files again: every handshake from now on uses them. Raises TlsError
        (and the files in use stay) when they do not load."""
        self._handover.current = _server_context(self.cfg, self.alpn)
        log.info("TLS: certificate %s loaded again", self.cfg.cert_file)


class ClientTls:
    """A client's TLS from files (mutual TLS between the gateway and its remote workers):
    ``context`` for each new connection, ``reload`` on SIGHUP; ``generation`` counts the
    reloads, so a holder of long-lived connections can tell it should open new ones."""

    def __init__(self, cfg: TlsConfig) -> None:
        self.cfg = cfg
        self.context = client_context(cfg)
        self.generation = 0

    def reload(self) -> None:
        """Load the files again for the next connections (open ones keep theirs). Raises
        TlsError (and the files in use stay) when they do not load."""
        self.context = client_context(self.cfg)
        self.generation += 1
        log.info("TLS: client certificate %s loaded again", self.cfg.cert_file)


# The gateway's side of its link to remote workers, one per worker_tls setting: every pool
# connects with it, and SIGHUP reloads it once for all of them.
_WORKER_LINKS: dict[TlsConfig, ClientTls] = {}


def worker_link(cfg: TlsConfig) -> ClientTls:
    """The shared :class:`ClientTls` of ``gateway.worker_tls`` (its files loaded on first use)."""
    link = _WORKER_LINKS.get(cfg)
    if link is None:
        link = _WORKER_LINKS[cfg] = ClientTls(cfg)
    return link


def client_context(cfg: TlsConfig) -> ssl.SSLContext:
    """A client's context presenting ``cfg``'s certificate and trusting ``client_ca_file`` for
    the server's (mTLS between the gateway and its remote workers: one CA for both sides)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        if cfg.client_ca_file:
            ctx.load_verify_locations(cfg.client_ca_file)
        else:
            ctx.load_default_certs()
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"TLS files {cfg.cert_file}, {cfg.key_file} do not load: {exc}") from None
    return ctx


__all__ = ["ClientTls", "ServerTls", "TlsError", "client_context", "worker_link"]
