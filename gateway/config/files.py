"""What every part of the configuration shares: its error, and the files it names.

A leaf module (it imports nothing of the gateway), so that parsers of parts of a service's
config (gateway/config/pipelines.py) raise the same ``ConfigError`` and resolve files the
same way as gateway.config, which re-exports them.
"""

from __future__ import annotations

from pathlib import Path


class ConfigError(ValueError):
    """A config value is missing or wrong; the message names the field."""


def resolve_path(value: str, base: Path | None, where: str) -> str:
    """A relative path against the working directory first, then the config file's directory."""
    p = Path(value)
    if p.is_absolute():
        return str(p)
    if p.exists() or base is None:
        return str(p.resolve())
    alt = base / p
    return str(alt.resolve() if alt.exists() else p.resolve())


def check_file(path: str, where: str) -> None:
    """A missing model or entry file is a config error (exit 2) rather than a worker that
    never loads (the service answering 503 with the reason only in the log)."""
    if not Path(path).is_file():
        what = "not a file" if Path(path).exists() else "file not found"
        raise ConfigError(f"{where}: {what}: {path}")


def existing_file(value: str, base: Path | None, where: str) -> str:
    """A path resolved as :func:`resolve_path` does, which must name a file."""
    path = resolve_path(value, base, where)
    check_file(path, where)
    return path


__all__ = ["ConfigError", "check_file", "existing_file", "resolve_path"]
