"""The long soak runs only when asked for by its marker (``-m soak``); the short one is part of
the default suite."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import digits_model
from tests.opt_in import skip_unless_selected

__all__ = ["digits_model"]

LONG = "soak"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_selected(config, items, LONG, f"the long soak runs with -m {LONG} (30 minutes by default)")
