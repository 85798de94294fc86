"""TLS settings of a listener (``gateway.tls``, ``gateway.grpc_tls``) and of the link to
remote workers (``gateway.worker_tls``): certificate and key files, and client certificates.

The config only reads and checks them (the files must exist); gateway.core.tls builds the
``ssl.SSLContext`` from them and loads the files again on SIGHUP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.config.files import check_file, resolve_path
from gateway.config.values import ConfigError, as_choice, as_str, check_keys

CLIENT_AUTH = ("none", "optional", "required")


@dataclass(frozen=True)
class TlsConfig:
    # The certificate chain (PEM, the leaf first) and its private key.
    cert_file: str
    key_file: str
    # Client certificates (mTLS): the CA bundle they must chain to, and whether a client
    # must present one (required), may (optional: a client without one is let in, one with
    # a bad one is refused), or is not asked (none).
    client_ca_file: str | None = None
    client_auth: str = "none"


_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth"}


def parse_tls(raw: Any, where: str, base: Any = None, *, mutual: bool = False) -> TlsConfig | None:
    """A ``tls:`` mapping (None: no TLS). ``mutual``: both sides always present a certificate
    of ``client_ca_file`` (the link to remote workers)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with cert_file and key_file")
    check_keys(raw, _KEYS, where)

    def path(key: str) -> str:
        value = resolve_path(as_str(raw.get(key), f"{where}.{key}"), base, f"{where}.{key}")
        check_file(value, f"{where}.{key}")
        return value

    cert, key = path("cert_file"), path("key_file")
    default = "required" if mutual else "none"
    choices = ("required",) if mutual else CLIENT_AUTH
    client_auth = as_choice(raw.get("client_auth", default), choices, f"{where}.client_auth")
    client_ca = path("client_ca_file") if raw.get("client_ca_file") is not None else None
    if client_auth != "none" and client_ca is None:
        raise ConfigError(f"{where}.client_ca_file: required with client_auth: {client_auth}")
    if client_auth == "none" and client_ca is not None:
        raise ConfigError(f"{where}.client_auth: say optional or required, or leave out client_ca_file")
    return TlsConfig(cert, key, client_ca, client_auth)


__all__ = ["CLIENT_AUTH", "TlsConfig", "parse_tls"]
