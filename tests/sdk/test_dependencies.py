"""The package's declared dependencies: bounded ranges, and an SDK that pulls no server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # in the standard library from Python 3.11

_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
_PROJECT = tomllib.loads(_PYPROJECT.read_text(encoding="utf-8"))["project"]
_SERVER_PACKAGES = {"aiohttp", "onnxruntime", "prometheus-client", "pyyaml", "uvloop"}


def _name(requirement: str) -> str:
    """The distribution name of a requirement, normalised as packaging does (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def _all_requirements() -> list[str]:
    extras = _PROJECT.get("optional-dependencies", {})
    return list(_PROJECT["dependencies"]) + [req for reqs in extras.values() for req in reqs]


@pytest.mark.parametrize("requirement", _all_requirements())
def test_every_dependency_has_an_upper_bound(requirement: str) -> None:
    if _name(requirement) == "easkit":  # the dev extra naming the package's own extras
        return
    spec = requirement.split(";")[0]
    assert re.search(r"<|~=|==", spec), f"{requirement!r} has no upper bound"


def test_the_sdk_alone_pulls_no_server_package() -> None:
    base = {_name(req) for req in _PROJECT["dependencies"]}
    assert not base & _SERVER_PACKAGES, base & _SERVER_PACKAGES
    assert {"protobuf", "numpy", "websockets", "httptools"} <= base


def test_server_packages_come_with_the_gateway_extra() -> None:
    gateway = {_name(req) for req in _PROJECT["optional-dependencies"]["gateway"]}
    assert _SERVER_PACKAGES <= gateway


def test_importing_every_sdk_module_loads_no_server_or_http_library() -> None:
    # The failure classifier recognises aiohttp's and urllib3's exceptions without importing them.
    code = (
        "import importlib, pkgutil, sys, eas_sdk\n"
        "for m in pkgutil.walk_packages(eas_sdk.__path__, 'eas_sdk.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] in {names!r}))\n"
    ).format(names={"aiohttp", "urllib3", "onnxruntime", "prometheus_client", "yaml", "uvloop"})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout
