"""The start-up's objects kept out of the cyclic garbage collector's sight.

A gateway or worker that has started holds a few hundred thousand objects that live as long
as the process: modules, loaded models, services, routes. Python's collector scans all of
them in every full collection, and under load full collections come every few seconds (a
call's objects that outlive two young collections, as calls in flight do, count towards
the next): each one stopped every call for 50-100 ms on a two-core machine, the p99 of
every protocol whose decoding makes many objects (V2 JSON). Frozen once the process is
ready, they are left out of those scans (``gc.freeze``), and a full collection takes a few
milliseconds.

A frozen object held in a reference cycle is freed only by a full collection that sees it:
when a service stops (deleted, replaced, reloaded), what it held (sessions, models: a
TensorFlow model is cycles through and through) would stay for good. So a stop thaws the
heap (``thaw``: the collector sees everything again) and, once the change is over,
``refreeze`` collects and freezes what is still alive: a full collection per change.
"""

from __future__ import annotations

import gc

# Whether this process froze its start-up heap: only such a process thaws and refreezes.
_FROZE = False


def freeze_startup_heap() -> None:
    """Collect the start-up's garbage, then freeze every object still alive: call once a
    process is ready to serve. Frozen objects are still freed when no reference is left;
    only a cycle among them would never be (see ``thaw``)."""
    global _FROZE
    _FROZE = True
    gc.collect()
    gc.freeze()


def thaw() -> None:
    """Give the frozen objects back to the collector (a part of the process was let go:
    what it held may be cycles only a full collection frees)."""
    if _FROZE:
        gc.unfreeze()


def refreeze() -> None:
    """Collect, then freeze what is still alive: once what was let go is unreferenced."""
    if _FROZE:
        gc.collect()
        gc.freeze()


__all__ = ["freeze_startup_heap", "refreeze", "thaw"]
