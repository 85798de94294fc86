"""What the admin API changed, kept in the data directory so it survives a restart.

One JSON file, ``<data_dir>/managed-services.json`` (mode 0600: it holds tokens), written
atomically. It is an overlay on the config file, which stays the starting point: a service
created or updated through the API is kept here whole and replaces the file's entry of the
same name; a deleted one is kept as ``null`` and hides the file's entry. Services the API
never touched follow the file (and its reloads).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from gateway.config import ConfigError, ServiceConfig, parse_service
from gateway.manage.spec import spec_of

log = logging.getLogger("gateway.manage")

FILE_NAME = "managed-services.json"
# Each service's releases (canaries, blue-green switches) and their outcomes, newest last.
HISTORY_FILE = "service-history.json"
HISTORY_MAX = 50  # per service


class ManagedStore:
    def __init__(self, data_dir: str) -> None:
        self.path = Path(data_dir) / FILE_NAME
        # name -> ServiceConfig (created or updated) or None (deleted), in order of change.
        self.overlay: dict[str, ServiceConfig | None] = {}
        self.history_path = Path(data_dir) / HISTORY_FILE
        self.history: dict[str, list[dict[str, Any]]] = {}

    def load(self) -> None:
        """Read the overlay; an entry that no longer validates (its model file is gone) is
        logged and left out, so one stale entry cannot keep the gateway from starting."""
        try:
            history = json.loads(self.history_path.read_text(encoding="utf-8"))
            self.history = {k: v for k, v in history.items() if isinstance(v, list)}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError) as exc:
            log.error("%s: the services' history is left out: %s", self.history_path, exc)
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{self.path}: cannot read the managed services: {exc}") from None
        entries = doc.get("services", {}) if isinstance(doc, dict) else {}
        for name, raw in entries.items():
            if raw is None:
                self.overlay[name] = None
                continue
            try:
                self.overlay[name] = parse_service(raw, where=f"{FILE_NAME}: {name}")
            except ConfigError as exc:
                log.error("managed service %s left out: %s", name, exc)

    def put(self, svc: ServiceConfig) -> None:
        self.overlay.pop(svc.name, None)
        self.overlay[svc.name] = svc
        self._save()

    def delete(self, name: str) -> None:
        self.overlay.pop(name, None)
        self.overlay[name] = None
        self._save()

    def record(self, name: str, event: dict[str, Any]) -> None:
        """Add an event to the service's history (kept across restarts, the last ones only)."""
        events = self.history.setdefault(name, [])
        events.append(event)
        del events[:-HISTORY_MAX]
        _write(self.history_path, {"version": 1, **self.history}, ".history-")

    def apply(self, services: tuple[ServiceConfig, ...]) -> tuple[ServiceConfig, ...]:
        """The config file's services with the overlay on top."""
        out: list[ServiceConfig] = []
        for svc in services:
            if svc.name not in self.overlay:
                out.append(svc)
            elif (managed := self.overlay[svc.name]) is not None:
                out.append(managed)
        known = {s.name for s in services}
        out.extend(s for n, s in self.overlay.items() if s is not None and n not in known)
        return tuple(out)

    def _save(self) -> None:
        doc: dict[str, Any] = {
            "version": 1,
            "services": {n: None if s is None else spec_of(s, redact=False) for n, s in self.overlay.items()},
        }
        _write(self.path, doc, ".managed-")


def _write(path: Path, doc: dict[str, Any], prefix: str) -> None:
    """Replace ``path`` with ``doc`` atomically, readable by the gateway's user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["FILE_NAME", "HISTORY_FILE", "ManagedStore"]
