"""The model runtimes' libraries a test needs (torch, tensorflow, sklearn_pmml_model, xgboost,
lightgbm, ...), imported by :func:`require_runtime`: a missing one skips the test, and under CI
fails it where scripts/setup.sh installs it, as tests/client_venv.py does for the reference
clients' environments: a suite never passes by skipping."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What scripts/setup.sh installs in .venv alone (the torch, tensorflow and pmml extras: their
# pinned wheels are Python 3.11's there); every other runtime comes with the dev extra, in
# each environment it builds (.venv-py312 and .venv-py313 too).
VENV_ONLY = frozenset({"torch", "tensorflow", "sklearn_pmml_model"})


def _installed_here(module: str) -> bool:
    """Whether scripts/setup.sh installs ``module`` in the environment running the tests."""
    if module.partition(".")[0] not in VENV_ONLY:
        return True
    return Path(sys.prefix).resolve() == (ROOT / ".venv").resolve()


def require_runtime(module: str) -> ModuleType:
    """``module`` imported; where it is missing, the test (or the whole module, at its top
    level) is skipped, or under CI (``CI`` set) failed when scripts/setup.sh installs it in
    this environment."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get("CI") and _installed_here(module):
            pytest.fail(f"{module} is missing ({exc}): run scripts/setup.sh", pytrace=False)
        where = "" if _installed_here(module) else " (scripts/setup.sh installs it in .venv only)"
        pytest.skip(f"{module} is not installed here{where}", allow_module_level=True)


__all__ = ["VENV_ONLY", "require_runtime"]
