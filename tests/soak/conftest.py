"""The long soak runs only when asked for by its marker (``-m soak``); the short one is part of
the default suite."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import digits_model

__all__ = ["digits_model"]

LONG = "soak"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if LONG in (config.getoption("markexpr", "") or ""):
        return
    skip = pytest.mark.skip(reason=f"the long soak runs with -m {LONG} (30 minutes by default)")
    for item in items:
        if item.get_closest_marker(LONG) is not None:
            item.add_marker(skip)
