"""Large request bodies are parsed in a helper process, one at a time.

A JSON parser (and Pillow decoding an image) holds Python's GIL for the whole call: a
thread would stall the event loop, and with it every other service, for as long as one
value-dense body takes to parse (over 100 ms for a few megabytes). A helper process has its
own GIL. What crosses back is compact by construction: the parsers used here return
numpy arrays or bytes (a V2 request's tensors, a Cluster Serving batch's body), so the
result is a copy, not a second parse.

The helper starts on first use (``spawn``: never a fork of a threaded gateway) and is
replaced if it dies; a parse that kills it (the kernel's OOM killer) is answered 503 and
the next one gets a new helper. The parse functions raise the protocol's own errors, which
must survive pickling (they keep their status through ``__reduce__``).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from gateway.core import errors

T = TypeVar("T")
PARSER_NICENESS = 10

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
# One parse at a time per event loop (tests run several loops in one process): a parse
# makes Python objects of 10-20 times the body, so several side by side would multiply it.
_PARSING: weakref.WeakKeyDictionary[Any, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _background() -> None:
    # Parsing a large body is bulk work: when the cores are busy, the event loop and the
    # workers answering small calls go first.
    os.nice(PARSER_NICENESS)


def _executor() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_background
            )
        return _pool


def _forget(pool: ProcessPoolExecutor) -> None:
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None


def shutdown() -> None:
    """Stop the helper process (the gateway calls it on the way out)."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


async def parse_off_loop(fn: Callable[[], T]) -> T:
    """``fn()`` in the helper process, one call at a time per event loop. ``fn`` must be
    picklable (a module-level function, or a functools.partial of one, with its arguments)."""
    loop = asyncio.get_running_loop()
    gate = _PARSING.get(loop)
    if gate is None:
        gate = _PARSING[loop] = asyncio.Semaphore(1)
    async with gate:
        pool = _executor()
        try:
            return await loop.run_in_executor(pool, fn)
        except BrokenProcessPool:
            _forget(pool)
            # Reaps the dead process (a join, quick), off the loop all the same.
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
            raise errors.ServiceNotReady("the parser process died while parsing the request's body") from None


__all__ = ["parse_off_loop", "shutdown"]
