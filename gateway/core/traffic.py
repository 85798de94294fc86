"""Which version of a service a call runs on: the one it names, else one drawn from the
service's traffic split (gateway.config.traffic), else the latest.

A call names its version by its path (V2's ``/versions/N``, gRPC's ``model_version``) or by
the :data:`VERSION_HEADER` request header (every other protocol); every answer from a
service with versions carries the version that served it in the same header.
"""

from __future__ import annotations

import random

from gateway.config.traffic import Traffic

VERSION_HEADER = "X-Model-Version"


def draw(traffic: Traffic) -> str:
    """A version drawn with its share of the split (the percents add up to 100)."""
    # Not a secret: a fair draw is all that is needed, so the fast generator serves.
    point = random.random() * 100.0
    for version, percent in traffic:
        point -= percent
        if point < 0.0:
            return version
    return next(v for v, w in reversed(traffic) if w)  # only float rounding lands here


__all__ = ["VERSION_HEADER", "draw"]
