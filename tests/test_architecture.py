"""The shape of the code: the layers contract holds, and long modules are accounted for.

The layers and the absence of import cycles are import-linter's contracts, declared in
``pyproject.toml`` ([tool.importlinter]); this module runs them, and checks on a throw-away
package that they catch what they are meant to catch (an upward import, one hidden under
``if TYPE_CHECKING:``, a cycle). Module length is a reviewed budget, not a hard limit: a
hand-written module past ``BUDGET`` lines is listed, with the reason it stays whole, in the
table of ``docs/architecture.md``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eas_sdk", "gateway")
# Generated protobuf code is not held to the budget.
GENERATED = ("eas_sdk/_proto/", "gateway/_proto/")
BUDGET = 800
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(cwd: Path, *args: str, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_import_contracts_hold() -> None:
    run = _lint_imports(ROOT, pythonpath=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "BROKEN" not in run.stdout and "0 broken" in run.stdout


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


_PROBE_CONFIG = """
[importlinter]
root_package = probe

[importlinter:contract:layers]
name = probe layers
type = layers
containers = probe
layers =
    top
    left | right
    bottom

[importlinter:contract:cycles]
name = probe cycles
type = acyclic_siblings
ancestors = probe
"""


def _probe(
    tmp_path: Path, bottom: str, right: str = "from probe import bottom\n"
) -> subprocess.CompletedProcess[str]:
    """A package of four layered modules, ``bottom`` and ``right`` given, checked by the
    same kinds of contract as the project's."""
    _write(
        tmp_path,
        {
            "probe/__init__.py": "",
            "probe/top.py": "from probe import left, right\n",
            "probe/left.py": "from probe import bottom\n",
            "probe/right.py": right,
            "probe/bottom.py": bottom,
            "probe.ini": _PROBE_CONFIG,
        },
    )
    return _lint_imports(tmp_path, "--config", "probe.ini", pythonpath=tmp_path)


def test_contracts_accept_a_tree_that_keeps_them(tmp_path: Path) -> None:
    run = _probe(tmp_path, "X = 1\n")
    assert run.returncode == 0, run.stdout + run.stderr


def test_contracts_refuse_an_upward_import(tmp_path: Path) -> None:
    run = _probe(tmp_path, "def late():\n    from probe import top\n")
    assert run.returncode == 1 and "probe.bottom -> probe.top" in run.stdout, run.stdout


def test_contracts_refuse_an_upward_import_under_type_checking(tmp_path: Path) -> None:
    bottom = """
    from typing import TYPE_CHECKING
    if TYPE_CHECKING:
        from probe.left import thing
    """
    run = _probe(tmp_path, bottom)
    assert run.returncode == 1 and "probe.bottom -> probe.left" in run.stdout, run.stdout


def test_contracts_refuse_independent_siblings_that_meet(tmp_path: Path) -> None:
    run = _probe(tmp_path, "X = 1\n", right="from probe import bottom, left\n")
    assert run.returncode == 1 and "probe.right -> probe.left" in run.stdout, run.stdout


def test_contracts_refuse_a_cycle(tmp_path: Path) -> None:
    _write(tmp_path, {"probe/sub/__init__.py": "", "probe/sub/a.py": "from probe.sub import b\n"})
    _write(tmp_path, {"probe/sub/b.py": "def later():\n    from probe.sub import a\n"})
    run = _probe(tmp_path, "from probe import sub\n")
    assert run.returncode == 1 and "No cycles are allowed in probe.sub" in run.stdout, run.stdout


# ---------------------------------------------------------------------- module budget
def _sizes() -> dict[str, int]:
    sizes: dict[str, int] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(GENERATED):
                continue
            with path.open(encoding="utf-8") as fh:
                sizes[rel] = sum(1 for _ in fh)
    return sizes


def _budget_table() -> dict[str, str]:
    """``docs/architecture.md``'s "Long modules" table: module path -> the reason it stays whole."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Long modules", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+\.py)` \| (.+?) \|$", section, flags=re.MULTILINE)
    return dict(rows)


def test_long_modules_are_accounted_for() -> None:
    sizes = _sizes()
    listed = _budget_table()
    over = sorted(rel for rel, n in sizes.items() if n > BUDGET)
    unexplained = [f"{rel} ({sizes[rel]} lines)" for rel in over if not listed.get(rel, "").strip()]
    assert not unexplained, (
        f"modules over {BUDGET} lines need a reason in docs/architecture.md's 'Long modules' table: "
        + ", ".join(unexplained)
    )
    # A module that shrank below the budget leaves the table, so the table stays true.
    stale = sorted(rel for rel in listed if sizes.get(rel, 0) <= BUDGET)
    assert not stale, f"listed as long but no longer over {BUDGET} lines (or gone): {stale}"
