"""Long runs that a suite keeps out of the default run: a marker's tests run only when ``-m``
names the marker, so CI's plain ``pytest`` stays short while the long run is one flag away."""

from __future__ import annotations

import pytest


def skip_unless_selected(config: pytest.Config, items: list[pytest.Item], marker: str, reason: str) -> None:
    """From ``pytest_collection_modifyitems``: skip the items marked ``marker`` (with ``reason``)
    unless the ``-m`` expression names it."""
    if marker in (config.getoption("markexpr", "") or ""):
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker(marker) is not None:
            item.add_marker(skip)
