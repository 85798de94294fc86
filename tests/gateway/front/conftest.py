"""Every test that starts ``fakes.live_gateway`` runs twice: once with the listener the
gateway CLI uses (``FastSite``: lean front for plain predict and queue calls, aiohttp for
the rest) and once with aiohttp alone, so the two paths must answer alike."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.front import fakes


@pytest.fixture(params=["fast", "aiohttp"])
def front(request: pytest.FixtureRequest) -> Iterator[str]:
    fakes.SITE = request.param
    try:
        yield request.param
    finally:
        fakes.SITE = "fast"
