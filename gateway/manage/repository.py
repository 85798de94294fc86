"""A model repository folder as services, in the layout Triton uses.

``DIR/NAME/`` is served as NAME from its highest numbered version folder
(``DIR/NAME/3/model.onnx``, reported as version "3"), or from the folder itself (version "1")
when it has no version folders. In that folder the model is ``model.<ext>``, its processor
picked by the suffix as ``serve --model`` picks it (gateway.config.catalog.runtime_for:
``.onnx``, ``.joblib``/``.pkl`` sklearn, ``.json``/``.ubj`` xgboost, ``.txt`` lightgbm,
``.pt`` torch, ``.pmml`` pmml), or a SavedModel (``model.savedmodel/``, as Triton names it, or
the version folder itself holding ``saved_model.pb``, as TensorFlow Serving lays it out); a
folder with no ``model.*`` may hold one file of a model's suffix instead (``.json`` and
``.txt`` excepted: beside a model they are labels and settings). ``DIR/NAME.<ext>`` is
served as NAME too, for the same suffixes. Other files (``config.pbtxt``, labels) are left
alone; a folder in which no model can be told is refused, naming the file and the suffixes
known. Each service carries its version and its model file's modification time and size in
``config``, so a new version or a replaced file reads as a changed service and is rolled.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path, PurePosixPath
from typing import Any

from gateway.config import SERVICE_NAME_RE, ConfigError
from gateway.config.catalog import FOLDER_MODELS, MODEL_SUFFIXES, PICKLE_PROCESSORS, runtime_for
from gateway.config.model_urls import source_for

log = logging.getLogger("gateway.manage")

# Suffixes that also name files kept beside a model (labels.txt, a preprocessing config.json):
# such a file is a model only when named model.<ext> (or a top-level NAME.<ext> is not one).
_SHARED_SUFFIXES = (".json", ".txt")
# Triton's name for a SavedModel folder inside a version folder.
SAVED_MODEL = "model.savedmodel"
_THIS = "."  # the folder itself is the model (a SavedModel)


def known_suffixes() -> str:
    return (
        ", ".join(MODEL_SUFFIXES) + f", a SavedModel folder ({SAVED_MODEL}/ or {FOLDER_MODELS['tensorflow']})"
    )


def pick(where: str, files: Collection[str], folders: dict[str, Collection[str]]) -> tuple[str, str]:
    """(the model's name in a folder, its processor), from the folder's file names and its
    subfolders' (name -> the names in it); ``"."`` when the folder itself is the model.
    Refuses (ConfigError) a folder whose model cannot be told."""
    itself = runtime_for(where, files)
    if itself is not None:
        return _THIS, itself
    found = {n: runtime_for(n) for n in files}
    found |= {n: runtime_for(n, inside) for n, inside in folders.items()}
    found = {n: kind for n, kind in found.items() if kind is not None}
    named = sorted(n for n in found if PurePosixPath(n).stem == "model")
    if not named:
        named = sorted(n for n in found if PurePosixPath(n).suffix.lower() not in _SHARED_SUFFIXES)
    if len(named) == 1:
        return named[0], found[named[0]]
    if named:
        raise ConfigError(f"{where}: more than one model ({', '.join(named)}); keep one, named model.<ext>")
    unknown = sorted(n for n in [*files, *folders] if PurePosixPath(n).stem == "model")
    if unknown:
        raise ConfigError(
            f"{where}/{unknown[0]}: not a model file the gateway can tell (it serves {known_suffixes()})"
        )
    raise ConfigError(f"{where}: holds no model file (model.<ext>; the gateway serves {known_suffixes()})")


def _top_level(name: str) -> str | None:
    """The processor of a file directly in the repository, served as its stem; None: not a model."""
    if PurePosixPath(name).suffix.lower() in _SHARED_SUFFIXES:
        return None
    return runtime_for(name)


def _locate(entry: Path) -> tuple[str, Path, str, str]:
    """(service name, model path, processor, version) of one repository entry folder."""
    versions = sorted(
        (int(p.name), p) for p in entry.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name)
    )
    folder, version = (versions[-1][1], str(versions[-1][0])) if versions else (entry, "1")
    files = [p.name for p in folder.iterdir() if p.is_file()]
    subfolders = {p.name: [q.name for q in p.iterdir()] for p in folder.iterdir() if p.is_dir()}
    name, kind = pick(f"{entry.name}/{version}" if versions else entry.name, files, subfolders)
    return entry.name, folder if name == _THIS else folder / name, kind, version


def _fingerprint(model: Path) -> str:
    """Changes when the model does: a file's modification time and size, a folder's files'."""
    paths = sorted(p for p in model.rglob("*") if p.is_file()) if model.is_dir() else [model]
    return ";".join(f"{p.stat().st_mtime_ns}:{p.stat().st_size}" for p in paths)


def scan(root: Path, defaults: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Service descriptions (``services:`` entries) for every model in ``root``."""
    out: list[dict[str, Any]] = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_file():
            kind = _top_level(entry.name)
            if kind is None:
                continue
            name, model, version = entry.stem, entry, "1"
        else:
            name, model, kind, version = _locate(entry)
        if not SERVICE_NAME_RE.fullmatch(name):
            log.warning("model repository: %r is not a valid service name; skipped", name)
            continue
        path = str(model.resolve())
        # Served as the version its folder names (``NAME/2/`` is version "2", as Triton reports it).
        where = {"model": path} if version == "1" else {"versions": {version: path}}
        out.append(
            {
                **(defaults or {}),
                "name": name,
                "processor": kind,
                **where,
                "config": {"version": version, "fingerprint": _fingerprint(model)},
            }
        )
    return out


def scan_url(
    url: str, defaults: dict[str, Any] | None = None, sources: tuple[Any, ...] = ()
) -> list[dict[str, Any]]:
    """The same, for a repository in a bucket (``s3://bucket/models/``, ``oss://...``): the
    objects under the prefix read in the same layout, each model named by its URL (the
    gateway fetches it, gateway.sources) and fingerprinted by its ETag. A bucket's models
    are files: a SavedModel folder or a pickle in one is refused (a pickle runs code, and
    loads only from the operator's model folders)."""
    from gateway.sources.stores import list_objects

    base = url if url.endswith("/") else url + "/"
    entries: dict[str, dict[str, tuple[str, int]]] = {}  # name -> {path below it: (etag, size)}
    loose: dict[str, str] = {}  # name -> a top-level model's file name
    for key, etag, size in list_objects(url, source_for(url, sources)):
        head, _, rest = key.partition("/")
        if not head or head.startswith("."):
            continue
        if not rest:
            if _top_level(head) is not None:
                loose[PurePosixPath(head).stem] = head
                entries.setdefault(PurePosixPath(head).stem, {})[""] = (etag, size)
            continue
        entries.setdefault(head, {})[rest] = (etag, size)
    out: list[dict[str, Any]] = []
    for name, files in sorted(entries.items()):
        rest, kind, version = _locate_keys(name, files, loose.get(name))
        if not SERVICE_NAME_RE.fullmatch(name):
            log.warning("model repository: %r is not a valid service name; skipped", name)
            continue
        if kind in PICKLE_PROCESSORS:
            raise ConfigError(
                f"{name}: a {kind} model is a pickle, and loading one runs its code: it is served from "
                "a repository folder on this host, not from a bucket"
            )
        etag, size = files[rest]
        model = base + (loose[name] if rest == "" else f"{name}/{rest}")
        where = {"model": model} if version == "1" else {"versions": {version: model}}
        out.append(
            {
                **(defaults or {}),
                "name": name,
                "processor": kind,
                **where,
                "config": {"version": version, "fingerprint": f"{etag}:{size}"},
            }
        )
    return out


def _locate_keys(name: str, files: dict[str, Any], loose: str | None = None) -> tuple[str, str, str]:
    """(the model's path below the entry, its processor, version) in a bucket entry's keys, as
    _locate does for a folder; ``""`` is a top-level model file (``loose``, its name)."""
    if loose is not None and "" in files:
        return "", runtime_for(loose) or "onnx", "1"
    versions = sorted({int(k.split("/")[0]) for k in files if "/" in k and k.split("/")[0].isdigit()} - {0})
    folder = f"{versions[-1]}/" if versions else ""
    below = [k[len(folder) :] for k in files if k.startswith(folder)]
    subfolders: dict[str, list[str]] = {}
    for k in below:
        sub, _, rest = k.partition("/")
        if rest:
            subfolders.setdefault(sub, []).append(rest)
    where = f"{name}/{versions[-1]}" if versions else name
    chosen, kind = pick(where, [k for k in below if "/" not in k], subfolders)
    if chosen == _THIS or chosen in subfolders:
        raise ConfigError(
            f"{where}: a SavedModel folder is served from a repository folder on this host, not a bucket"
        )
    return folder + chosen, kind, str(versions[-1]) if versions else "1"


__all__ = ["known_suffixes", "pick", "scan", "scan_url"]
