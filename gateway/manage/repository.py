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
from gateway.config.model_urls import source_for

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


def scan_url(
    url: str, defaults: dict[str, Any] | None = None, sources: tuple[Any, ...] = ()
) -> list[dict[str, Any]]:
    """The same, for a repository in a bucket (``s3://bucket/models/``, ``oss://...``): the
    objects under the prefix read in the same layout, each model named by its URL (the
    gateway fetches it, gateway.sources) and fingerprinted by its ETag."""
    from gateway.sources.stores import list_objects

    base = url if url.endswith("/") else url + "/"
    entries: dict[str, dict[str, tuple[str, int]]] = {}  # name -> {path below it: (etag, size)}
    for key, etag, size in list_objects(url, source_for(url, sources)):
        head, _, rest = key.partition("/")
        if not head or head.startswith("."):
            continue
        if not rest:
            if head.endswith(".onnx"):
                entries.setdefault(head.removesuffix(".onnx"), {})[""] = (etag, size)
            continue
        entries.setdefault(head, {})[rest] = (etag, size)
    out: list[dict[str, Any]] = []
    for name, files in sorted(entries.items()):
        located = _locate_keys(files)
        if located is None:
            log.debug("model repository: %s holds no single .onnx model; skipped", name)
            continue
        if not SERVICE_NAME_RE.fullmatch(name):
            log.warning("model repository: %r is not a valid service name; skipped", name)
            continue
        rest, version = located
        etag, size = files[rest]
        model = base + (f"{name}.onnx" if rest == "" else f"{name}/{rest}")
        where = {"model": model} if version == "1" else {"versions": {version: model}}
        out.append(
            {
                **(defaults or {}),
                "name": name,
                "processor": "onnx",
                **where,
                "config": {"version": version, "fingerprint": f"{etag}:{size}"},
            }
        )
    return out


def _locate_keys(files: dict[str, tuple[str, int]]) -> tuple[str, str] | None:
    """(the model's path below the entry, version) in a bucket entry's keys, as _locate does
    for a folder; ``""`` is a top-level ``NAME.onnx``."""
    if "" in files:
        return "", "1"
    versions = sorted({int(k.split("/")[0]) for k in files if "/" in k and k.split("/")[0].isdigit()} - {0})
    folder = f"{versions[-1]}/" if versions else ""
    inside = [k[len(folder) :] for k in files if k.startswith(folder) and "/" not in k[len(folder) :]]
    onnx = sorted(k for k in inside if k.endswith(".onnx"))
    chosen = "model.onnx" if "model.onnx" in onnx else onnx[0] if len(onnx) == 1 else None
    if chosen is None:
        return None
    return folder + chosen, str(versions[-1]) if versions else "1"


__all__ = ["scan", "scan_url"]
