"""A model repository folder as services, in the layout Triton uses.

``DIR/NAME.onnx`` is served as NAME. ``DIR/NAME/`` is served as NAME from its highest
numbered version folder (``DIR/NAME/3/model.onnx``, reported as version "3"), or from the
folder itself (version "1") when it has no version folders; in a folder the model is
``model.onnx`` or its only ``.onnx`` file. Other files (``config.pbtxt``, labels) are left
alone. Each service carries its version and its model file's modification time and size in
``config``, so a new version or a replaced file reads as a changed service and is rolled.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gateway.config import SERVICE_NAME_RE

log = logging.getLogger("gateway.manage")


def _model_in(folder: Path) -> Path | None:
    preferred = folder / "model.onnx"
    if preferred.is_file():
        return preferred
    found = sorted(p for p in folder.glob("*.onnx") if p.is_file())
    return found[0] if len(found) == 1 else None


def _locate(entry: Path) -> tuple[str, Path | None, str]:
    """(service name, model file or None, version) of one repository entry."""
    if entry.is_file():
        return entry.stem, entry, "1"
    versions = sorted(
        (int(p.name), p) for p in entry.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name)
    )
    if versions:
        number, folder = versions[-1]
        return entry.name, _model_in(folder), str(number)
    return entry.name, _model_in(entry), "1"


def scan(root: Path, defaults: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Service descriptions (``services:`` entries) for every model in ``root``."""
    out: list[dict[str, Any]] = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or (entry.is_file() and entry.suffix != ".onnx"):
            continue
        name, model, version = _locate(entry)
        if model is None:
            log.debug("model repository: %s holds no single .onnx model; skipped", entry.name)
            continue
        if not SERVICE_NAME_RE.fullmatch(name):
            log.warning("model repository: %r is not a valid service name; skipped", name)
            continue
        st = model.stat()
        fingerprint = f"{st.st_mtime_ns}:{st.st_size}"
        path = str(model.resolve())
        # Served as the version its folder names (``NAME/2/`` is version "2", as Triton reports it).
        where = {"model": path} if version == "1" else {"versions": {version: path}}
        out.append(
            {
                **(defaults or {}),
                "name": name,
                "processor": "onnx",
                **where,
                "config": {"version": version, "fingerprint": fingerprint},
            }
        )
    return out


__all__ = ["scan"]
