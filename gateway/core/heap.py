"""The start-up's objects kept out of the cyclic garbage collector's sight.

A gateway or worker that has started holds a few hundred thousand objects that live as long
as the process: modules, loaded models, services, routes. Python's collector scans all of
them in every full collection, and under load full collections come every few seconds (a
call's objects that outlive two young collections, as calls in flight do, count towards
the next): each one stopped every call for 50-100 ms on a two-core machine, the p99 of
every protocol whose decoding makes many objects (V2 JSON). Frozen once the process is
ready, they are left out of those scans (``gc.freeze``), and a full collection takes a few
milliseconds.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect the start-up's garbage, then freeze every object still alive: call once a
    process is ready to serve. Frozen objects are still freed when no reference is left;
    only a cycle among them would never be, and the start-up's objects live to the end."""
    gc.collect()
    gc.freeze()


__all__ = ["freeze_startup_heap"]
