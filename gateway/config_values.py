"""Reading single configuration values: types, environment variables, tokens, and the
error that names the field. ``gateway.config`` builds the schema on these.

YAML reads some unquoted values as something other than the string that was meant
(``0123456`` as an octal number, ``yes`` as true): a string field given such a value is
refused with a message saying how to quote it, never silently converted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.config import Config

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ConfigError(ValueError):
    """A config value is missing or wrong; the message names the field."""


def expand(value: Any, where: str) -> Any:
    if isinstance(value, str):

        def repl(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in os.environ:
                raise ConfigError(f"{where}: environment variable {name} is not set")
            return os.environ[name]

        return _ENV_RE.sub(repl, value)
    if isinstance(value, list):
        return [expand(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: expand(v, f"{where}.{k}") for k, v in value.items()}
    return value


def int_value(v: Any, where: str, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
            v = int(v)
        else:
            raise ConfigError(f"{where}: expected an integer, got {v!r}")
    if lo is not None and v < lo:
        raise ConfigError(f"{where}: must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ConfigError(f"{where}: must be <= {hi}, got {v}")
    return v


def float_value(v: Any, where: str, lo: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ConfigError(f"{where}: expected a number, got {v!r}")
    try:
        out = float(v)
    except ValueError:
        raise ConfigError(f"{where}: expected a number, got {v!r}") from None
    if lo is not None and out < lo:
        raise ConfigError(f"{where}: must be >= {lo}, got {out}")
    return out


def bool_value(v: Any, where: str) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.lower() in ("true", "1", "yes")
    raise ConfigError(f"{where}: expected true or false, got {v!r}")


def yaml_hint(v: Any, where: str) -> str:
    """The message for a value YAML read as something other than the string that was meant."""
    if isinstance(v, bool):
        return (
            f"{where}: expected a string, got the boolean {v!r}: YAML reads unquoted yes/no/on/off/"
            f'true/false as booleans; quote the value, e.g. {where.rsplit(".", 1)[-1]}: "yes"'
        )
    return (
        f"{where}: expected a string, got the number {v!r}: YAML reads unquoted digits as a number "
        f'(and 0-prefixed digits as octal); quote the value, e.g. {where.rsplit(".", 1)[-1]}: "0123456"'
    )


def str_value(v: Any, where: str) -> str:
    if isinstance(v, (bool, int, float)):
        raise ConfigError(yaml_hint(v, where))
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{where}: expected a non-empty string, got {v!r}")
    return v


def tokens_of(raw: Mapping[str, Any], where: str) -> tuple[str | None, tuple[str, ...], bool]:
    """(token, extra tokens, public). An open service must say so: ``public: true`` with no
    token (missing or ``token: null``); an empty token, or no token without ``public: true``,
    is an error, so a typo or an unset variable never opens a service."""
    public = bool_value(raw.get("public", False), f"{where}.public")
    extra = raw.get("tokens") or []
    if not isinstance(extra, list):
        raise ConfigError(f"{where}.tokens: expected a list of strings")
    extra_tokens = tuple(str_value(t, f"{where}.tokens[{j}]") for j, t in enumerate(extra))
    token = raw.get("token")
    if token is not None:
        if token == "":
            raise ConfigError(
                f"{where}.token: empty; give the service a token, or declare it open with "
                "'public: true' (and no token)"
            )
        token = str_value(token, f"{where}.token")
    if public and (token is not None or extra_tokens):
        raise ConfigError(f"{where}: 'public: true' and a token contradict each other; keep one")
    if not public and token is None and not extra_tokens:
        said = "token: null" if "token" in raw else "no token"
        raise ConfigError(
            f"{where}: {said}; give the service a token, or declare it open with 'public: true'"
        )
    return token, extra_tokens, public


def open_service_warnings(cfg: Config) -> list[str]:
    """Warnings due at start: services anyone who reaches the listener can call."""
    host = cfg.gateway.host
    if host in ("localhost", "") or host.startswith("127.") or host == "::1":
        return []
    return [
        f"service {svc.name!r} is public (no token) and the gateway listens on {host}, "
        "which is not a loopback address: anyone who reaches it can call the service"
        for svc in cfg.services
        if not svc.tokens
    ]


__all__ = [
    "ConfigError",
    "bool_value",
    "expand",
    "float_value",
    "int_value",
    "open_service_warnings",
    "str_value",
    "tokens_of",
    "yaml_hint",
]
