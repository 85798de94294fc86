"""``gateway.model_sources``: where the stores of models named by a URL are, and their
credentials (a secret file's path, never the secrets themselves).

A service's ``model`` (or a ``versions:`` entry) may be a URL: ``s3://bucket/key`` (any
S3-compatible store), ``oss://bucket/key`` (Alibaba OSS through its S3-compatible API),
``https://`` or ``http://``; ``file:///path`` is a local file, read as its path
(gateway.config.model_urls). The config only parses and checks a URL: the gateway fetches it
(gateway.sources) when the service starts::

    gateway:
      model_sources:
        - prefix: s3://models/                  # the URLs this entry applies to
          endpoint: https://minio.internal:9000
          credentials_file: /run/secrets/models-s3
"""

from __future__ import annotations

from typing import Any

from gateway.config.model_urls import ADDRESSING_STYLES, REMOTE_SCHEMES, ModelSource
from gateway.config.values import ConfigError, as_choice, as_float, as_str, check_keys

_SOURCE_KEYS = {
    "prefix",
    "endpoint",
    "region",
    "addressing_style",
    "credentials_file",
    "ca_file",
    "timeout_s",
}


def parse_model_sources(raw: Any, where: str) -> tuple[ModelSource, ...]:
    """``gateway.model_sources``: a list of settings, each for the model URLs under a prefix."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: expected a list of mappings (prefix, endpoint, credentials_file, ...)")
    out: list[ModelSource] = []
    for i, entry in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{w}: expected a mapping, got {type(entry).__name__}")
        check_keys(entry, _SOURCE_KEYS, w)
        prefix = as_str(entry.get("prefix"), f"{w}.prefix")
        if "://" not in prefix or prefix.split("://", 1)[0].lower() not in REMOTE_SCHEMES:
            raise ConfigError(
                f"{w}.prefix: expected a URL prefix ({', '.join(s + '://' for s in REMOTE_SCHEMES)})"
            )
        if "@" in prefix.split("://", 1)[1].split("/", 1)[0]:
            raise ConfigError(f"{w}.prefix: credentials do not belong in the config; use credentials_file")

        def opt(key: str, entry: dict[str, Any] = entry, w: str = w) -> str | None:
            value = entry.get(key)
            return None if value is None else as_str(value, f"{w}.{key}")

        endpoint = opt("endpoint")
        if endpoint is not None and "@" in endpoint:
            raise ConfigError(f"{w}.endpoint: credentials do not belong in the config; use credentials_file")
        out.append(
            ModelSource(
                prefix=prefix,
                endpoint=endpoint,
                region=opt("region"),
                addressing_style=as_choice(
                    entry.get("addressing_style", "auto"), ADDRESSING_STYLES, f"{w}.addressing_style"
                ),
                credentials_file=opt("credentials_file"),
                ca_file=opt("ca_file"),
                timeout_s=as_float(entry.get("timeout_s", 60.0), f"{w}.timeout_s", lo=0.1),
            )
        )
    return tuple(out)


__all__ = ["parse_model_sources"]
