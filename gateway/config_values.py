"""Checking config values: typed readers that name the field in their errors, and the
collector that lets one pass over a file report every error at once."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from typing import Any

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ConfigError(ValueError):
    """A config value is missing or wrong; the message names the field."""


class ConfigErrors(ConfigError):
    """Every error found in one config file or service description, one per line."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


class Errors:
    """Collects errors so that one pass reports all of them, each with its place."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def check(self, fn: Any, *args: Any, default: Any = None, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigErrors as exc:
            self.items.extend(exc.errors)
        except ConfigError as exc:
            self.items.append(str(exc))
        return default

    def add(self, message: str) -> None:
        self.items.append(message)

    def raise_any(self) -> None:
        if len(self.items) == 1:
            raise ConfigError(self.items[0])
        if self.items:
            raise ConfigErrors(self.items)


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


def as_int(v: Any, where: str, lo: int | None = None, hi: int | None = None) -> int:
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


def as_float(v: Any, where: str, lo: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ConfigError(f"{where}: expected a number, got {v!r}")
    try:
        out = float(v)
    except ValueError:
        raise ConfigError(f"{where}: expected a number, got {v!r}") from None
    if lo is not None and out < lo:
        raise ConfigError(f"{where}: must be >= {lo}, got {out}")
    return out


def as_bool(v: Any, where: str) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.lower() in ("true", "1", "yes")
    raise ConfigError(f"{where}: expected true or false, got {v!r}")


def as_str(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{where}: expected a non-empty string, got {v!r}")
    return v


def check_keys(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PROVIDER_RE = re.compile(r"^[A-Za-z]+ExecutionProvider$")


def as_strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of strings")
    return tuple(as_str(str(v), f"{where}[{i}]") for i, v in enumerate(value))


def as_choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise ConfigError(f"{where}: must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def as_mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping")
    return value


def as_env(value: Any, where: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """``env:`` as (values to set, names passed through from the gateway's environment):
    a mapping (a null value passes the name through) or a list of names."""
    if value is None:
        return {}, ()
    pairs = [(n, None) for n in value] if isinstance(value, list) else list(as_mapping(value, where).items())
    errs = Errors()
    values: dict[str, str] = {}
    names: list[str] = []
    for name, v in pairs:
        if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
            errs.add(f"{where}: {name!r} is not an environment variable name")
        elif v is None:
            names.append(name)
        else:
            values[name] = str(v)
    errs.raise_any()
    return values, tuple(names)


def as_providers(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a list such as [CUDAExecutionProvider, CPUExecutionProvider]")
    bad = [p for p in value if not isinstance(p, str) or not _PROVIDER_RE.match(p)]
    if bad:
        raise ConfigError(f"{where}: {bad[0]!r} is not an ONNX Runtime execution provider name")
    return tuple(value)


def as_tokens(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of strings")
    errs = Errors()
    out = tuple(errs.check(as_str, str(t), f"{where}[{j}]", default="") for j, t in enumerate(value))
    errs.raise_any()
    return out


__all__ = [
    "ConfigError", "ConfigErrors", "Errors", "as_bool", "as_choice", "as_env", "as_float", "as_int",
    "as_mapping", "as_providers", "as_str", "as_strings", "as_tokens", "check_keys", "expand", "is_loopback",
]  # fmt: skip
