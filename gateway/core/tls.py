"""TLS for the gateway's listeners and its link to remote workers: ``ssl.SSLContext`` from a
:class:`~gateway.config.tls.TlsConfig`, and its files loaded again on SIGHUP.

A listener keeps one context for its whole life; a reload loads the new certificate, key
and client CA bundle into that same context, so connections already open keep the session
they have (nothing is dropped) and every handshake after it gets the new certificate. The
new files are first loaded into a throw-away context, so a reload with a broken or
mismatched pair changes nothing and says why.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from gateway.config.tls import TlsConfig

log = logging.getLogger("gateway.tls")

_VERIFY = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class TlsError(Exception):
    """Certificate or key files that do not load (the message names the files, never their text)."""


def _server_context(cfg: TlsConfig, alpn: tuple[str, ...]) -> ssl.SSLContext:
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


class ServerTls:
    """One listener's TLS: ``context`` for its whole life, ``reload`` on SIGHUP."""

    def __init__(self, cfg: TlsConfig, alpn: tuple[str, ...] = ("http/1.1",)) -> None:
        self.cfg = cfg
        self.alpn = alpn
        self.context = _server_context(cfg, alpn)

    def read_files(self) -> tuple[bytes, bytes, bytes | None]:
        """(certificate chain, key, client CA bundle) as bytes, for runtimes that take PEM
        bytes rather than a context (gRPC)."""
        ca = Path(self.cfg.client_ca_file).read_bytes() if self.cfg.client_ca_file else None
        return Path(self.cfg.cert_file).read_bytes(), Path(self.cfg.key_file).read_bytes(), ca

    def reload(self) -> None:
        """Load the files again into the live context, after checking them on a fresh one."""
        _server_context(self.cfg, self.alpn)  # raises TlsError, and the live context is untouched
        _load(self.context, self.cfg)
        log.info("TLS: certificate %s loaded again", self.cfg.cert_file)


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


__all__ = ["ServerTls", "TlsError", "client_context"]
