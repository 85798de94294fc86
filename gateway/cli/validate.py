"""``eas-gateway validate CONFIG``: check a config file without starting anything.

Every error in the file is listed at once, each with its place in the YAML
(``services[2] (digits).workers: must be >= 1, got 0``); the exit status is 1 when
there is any, 0 when the file is good.
"""

from __future__ import annotations

import sys

from gateway.config import load_config
from gateway.config.values import ConfigError, ConfigErrors


def validate(path: str) -> int:
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        errors = exc.errors if isinstance(exc, ConfigErrors) else [str(exc)]
        for line in errors:
            print(f"{path}: {line}", file=sys.stderr)
        print(f"{path}: {len(errors)} error(s)", file=sys.stderr)
        return 1
    names = ", ".join(s.name for s in cfg.services) or "none"
    admin = f"; admin API on {cfg.admin.host}:{cfg.admin.port}" if cfg.admin is not None else ""
    print(f"{path}: OK, {len(cfg.services)} service(s): {names}{admin}")
    return 0


__all__ = ["validate"]
