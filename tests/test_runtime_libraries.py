"""tests/runtime_libraries.py's policy: a missing runtime skips its tests, and under CI fails
them wherever scripts/setup.sh installs it, so a CI run never passes by skipping them."""

from __future__ import annotations

import sys

import pytest

from tests.runtime_libraries import ROOT, require_runtime

# A module no environment has (sys.modules[name] = None makes its import raise ImportError).
MISSING = "easkit_runtime_that_is_not_installed"


@pytest.fixture
def missing(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setitem(sys.modules, MISSING, None)
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delenv("CI", raising=False)
    return monkeypatch


def outcome(module: str) -> tuple[str, str]:
    """("skipped" or "failed", the message) of requiring a missing ``module``; caught here, so
    that a skip where a failure is due fails this test rather than skipping it."""
    try:
        require_runtime(module)
    except pytest.skip.Exception as exc:
        return "skipped", str(exc.msg)
    except pytest.fail.Exception as exc:
        return "failed", str(exc.msg)
    raise AssertionError(f"{module} was imported")


def test_a_library_that_is_here_is_imported() -> None:
    assert require_runtime("json") is sys.modules["json"]


def test_a_missing_library_skips_locally(missing: pytest.MonkeyPatch) -> None:
    assert outcome(MISSING) == ("skipped", f"{MISSING} is not installed here")


def test_a_missing_library_fails_under_ci(missing: pytest.MonkeyPatch) -> None:
    missing.setenv("CI", "true")
    kind, message = outcome(MISSING)
    assert kind == "failed" and message.startswith(f"{MISSING} is missing ("), message
    assert message.endswith("): run scripts/setup.sh"), message


def test_under_ci_torch_is_required_only_where_setup_installs_it(missing: pytest.MonkeyPatch) -> None:
    """scripts/setup.sh installs torch, tensorflow and sklearn-pmml-model in .venv alone: on
    another Python's environment their tests skip under CI too, saying why."""
    missing.setenv("CI", "true")
    missing.setattr(sys, "prefix", str(ROOT / ".venv"))
    kind, message = outcome("torch")
    assert kind == "failed" and message.endswith("run scripts/setup.sh"), message
    missing.setattr(sys, "prefix", str(ROOT / ".venv-py312"))
    elsewhere = "torch is not installed here (scripts/setup.sh installs it in .venv only)"
    assert outcome("torch") == ("skipped", elsewhere)
