"""Fetching one model URL into the download cache, with its progress for the service's status.

Blocking (boto3 and urllib are): the gateway runs it in a thread. It asks the store for the
object's current version, takes the cached file when that version is there whole, and
downloads it otherwise, hashing as it writes; a size short of the store's, or a SHA-256
other than one the store vouches for, fails the fetch and leaves nothing in the cache.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gateway.config.model_urls import ModelSource, redact_url, source_for
from gateway.sources.cache import CachedModel, ModelCache
from gateway.sources.stores import ObjectInfo, Store, StoreError, open_store

log = logging.getLogger("gateway.sources")

# A progress line at most this often while a download runs, and one at each tenth.
LOG_EVERY_S = 5.0


class FetchError(Exception):
    """A model URL that could not be fetched: the message names the URL (no credentials)
    and what the store said."""


class FetchCancelled(FetchError):
    """The service stopped while its model was being fetched."""


@dataclass
class Progress:
    """A fetch as the service's status shows it; written by the fetching thread, read by
    the event loop (whole values, so a reader sees one state or the next)."""

    url: str  # as shown: no credentials
    phase: str = "checking"  # checking, downloading, verifying, done
    done: int = 0
    total: int | None = None

    def text(self) -> str:
        if self.phase == "downloading":
            if self.total:
                share = 100 * self.done / self.total
                return f"downloading model {self.url}: {_mib(self.done)} of {_mib(self.total)} ({share:.0f}%)"
            return f"downloading model {self.url}: {_mib(self.done)}"
        if self.phase == "verifying":
            return f"verifying the cached model {self.url}"
        return f"checking model {self.url}"


@dataclass(frozen=True)
class Fetched:
    path: Path
    version: str
    sha256: str
    size: int
    downloaded: bool  # False: found in the cache


def fetch_model(
    url: str,
    sources: tuple[ModelSource, ...],
    cache_dir: str,
    progress: Progress,
    cancelled: threading.Event | None = None,
) -> Fetched:
    """The URL's model as a local file in the cache (see the module docstring)."""
    shown = redact_url(url)
    cancelled = cancelled or threading.Event()
    try:
        store = open_store(url, source_for(url, sources))
        info = store.stat()
        progress.total = info.size
        cache = ModelCache(cache_dir)
        with cache.locked(url):
            if info.version is not None:
                progress.phase = "verifying"
                hit = cache.lookup(url, info.version)
                if hit is not None:
                    log.info("model %s: version in the cache (%s), not downloaded", shown, _mib(hit.size))
                    progress.phase, progress.done = "done", hit.size
                    return _fetched(hit, downloaded=False)
            entry = _download(url, shown, store, info, cache, progress, cancelled)
            cache.prune(url, entry.path)
    except FetchCancelled:
        raise
    except StoreError as exc:
        raise FetchError(f"cannot fetch model {shown}: {exc}") from None
    except OSError as exc:  # the cache folder: full, not writable
        raise FetchError(f"cannot fetch model {shown}: the download cache: {exc}") from None
    progress.phase = "done"
    return _fetched(entry, downloaded=True)


def _download(
    url: str,
    shown: str,
    store: Store,
    info: ObjectInfo,
    cache: ModelCache,
    progress: Progress,
    cancelled: threading.Event,
) -> CachedModel:
    size = info.size
    log.info("model %s: downloading%s", shown, f" {_mib(size)}" if size is not None else "")
    progress.phase, progress.done = "downloading", 0
    t0 = last_log = time.monotonic()
    next_tenth = 1
    digest = hashlib.sha256()
    with cache.part_file(url) as (part, sink), store.chunks(info) as (chunks, expected):
        for chunk in chunks:
            if cancelled.is_set():
                raise FetchCancelled(f"fetching model {shown} was cancelled")
            sink.write(chunk)
            digest.update(chunk)
            progress.done += len(chunk)
            now = time.monotonic()
            tenth = 10 * progress.done // size if size else 0
            if now - last_log >= LOG_EVERY_S or tenth >= next_tenth:
                if tenth >= next_tenth:
                    next_tenth = tenth + 1
                last_log = now
                log.info("%s", progress.text())
        sink.flush()
        if size is not None and progress.done != size:
            raise StoreError(f"the download ended after {progress.done} of {size} bytes")
        sha256 = digest.hexdigest()
        if expected is not None and expected != sha256:
            raise StoreError(f"the downloaded bytes' SHA-256 {sha256} is not the store's {expected}")
        version = info.version or f"sha256:{sha256}"
        entry = cache.store(url, shown, version, info.name, part, sha256)
    took = time.monotonic() - t0
    log.info("model %s: downloaded %s in %.1f s (sha256 %s)", shown, _mib(entry.size), took, sha256[:16])
    return entry


def _fetched(entry: CachedModel, downloaded: bool) -> Fetched:
    return Fetched(entry.path, entry.version, entry.sha256, entry.size, downloaded)


def _mib(size: int | None) -> str:
    """A size as people read it: bytes, KiB or MiB."""
    if size is None:
        return "?"
    if size < 1024:
        return f"{size} B"
    if size < 2**20:
        return f"{size / 1024:.1f} KiB"
    return f"{size / 2**20:.1f} MiB"


__all__ = ["FetchCancelled", "FetchError", "Fetched", "Progress", "fetch_model"]
