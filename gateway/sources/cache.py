"""The download cache: models fetched from a URL, on disk, by the object's version.

``<root>/<url hash>/<version hash>/<file name>`` with ``meta.json`` beside it (the URL as
shown, without credentials; the version, size and SHA-256). A version is what the store
says identifies the object's content (S3's version id or ETag, HTTP's ETag or Last-Modified
and length), so an unchanged object is found again after a restart and a changed one is
downloaded anew. A file is trusted only after its SHA-256 matches the one recorded when it
was downloaded. One download of a URL at a time, across processes too (an ``flock`` on the
URL's folder): two services, versions or gateways naming the same object wait for one
download instead of making two.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

CHUNK = 1024 * 1024
# Versions of one URL kept: the newest and the one before (a rolling update's old workers
# may still restart from it while the new ones load).
KEEP_VERSIONS = 2


@dataclass(frozen=True)
class CachedModel:
    path: Path
    version: str
    sha256: str
    size: int


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


class ModelCache:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def url_dir(self, url: str) -> Path:
        return self.root / _digest(url, 24)

    @contextlib.contextmanager
    def locked(self, url: str) -> Iterator[None]:
        """Hold the URL's lock (blocking): one fetch of a URL at a time, in every process."""
        folder = self.url_dir(url)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        with (folder / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def lookup(self, url: str, version: str) -> CachedModel | None:
        """The cached file of this version of the URL, if it is there whole (size and SHA-256
        as recorded); a damaged entry is removed."""
        entry = self.url_dir(url) / _digest(version, 16)
        try:
            meta = json.loads((entry / "meta.json").read_text())
            path = entry / meta["name"]
            if meta["version"] != version or path.stat().st_size != meta["size"]:
                raise ValueError("size or version")
            if file_sha256(path) != meta["sha256"]:
                raise ValueError("checksum")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            shutil.rmtree(entry, ignore_errors=True)
            return None
        return CachedModel(path, version, meta["sha256"], meta["size"])

    @contextlib.contextmanager
    def part_file(self, url: str) -> Iterator[tuple[Path, BinaryIO]]:
        """A temporary file in the URL's folder to download into (removed unless stored)."""
        folder = self.url_dir(url)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, name = tempfile.mkstemp(prefix=".part-", dir=folder)
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                yield path, f
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def store(self, url: str, shown: str, version: str, name: str, part: Path, sha256: str) -> CachedModel:
        """Move a finished download into its place; the metadata is written last, so an entry
        without it (a crash in between) is never taken for a whole one."""
        entry = self.url_dir(url) / _digest(version, 16)
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(mode=0o700)
        path = entry / name
        os.replace(part, path)
        size = path.stat().st_size
        meta = {"url": shown, "version": version, "name": name, "size": size, "sha256": sha256}
        tmp = entry / ".meta.json"
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, entry / "meta.json")
        (self.url_dir(url) / "url.txt").write_text(shown + "\n")
        return CachedModel(path, version, sha256, size)

    def prune(self, url: str, keep: Path) -> None:
        """Keep the newest versions of the URL (``keep``'s among them); remove the others."""
        folder = self.url_dir(url)
        entries = sorted(
            (p for p in folder.iterdir() if p.is_dir() and (p / "meta.json").exists()),
            key=lambda p: (p / "meta.json").stat().st_mtime_ns,
            reverse=True,
        )
        kept = {keep.parent}
        for entry in entries:
            if len(kept) >= KEEP_VERSIONS:
                break
            kept.add(entry)
        for entry in entries:
            if entry not in kept:
                shutil.rmtree(entry, ignore_errors=True)


__all__ = ["CHUNK", "CachedModel", "ModelCache", "file_sha256"]
