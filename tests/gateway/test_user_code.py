"""Importing the user's classes by entry name, for python processors and pipeline ops."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.user_code import import_class


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_files_with_one_name_in_two_folders_stay_two_modules(tmp_path: Path) -> None:
    a = _write(tmp_path / "a" / "ops.py", "class Op:\n    where = 'a'\n")
    b = _write(tmp_path / "b" / "ops.py", "class Op:\n    where = 'b'\n")
    assert import_class(f"{a}:Op").where == "a"
    assert import_class(f"{b}:Op").where == "b"


def test_a_file_is_imported_once(tmp_path: Path) -> None:
    path = _write(tmp_path / "once.py", "class P:\n    pass\n")
    assert import_class(f"{path}:P") is import_class(f"{path}:P")


def test_a_failed_import_is_tried_afresh(tmp_path: Path) -> None:
    path = _write(tmp_path / "flaky.py", "raise RuntimeError('not yet')\n")
    with pytest.raises(RuntimeError, match="not yet"):
        import_class(f"{path}:P")
    path.write_text("class P:\n    pass\n")
    assert import_class(f"{path}:P").__name__ == "P"


@pytest.mark.parametrize(
    ("entry", "error", "message"),
    [
        ("no_colon", ValueError, "expected 'path/to/file.py:Class'"),
        (":P", ValueError, "expected"),
        ("json:", ValueError, "expected"),
        ("json:Nope", AttributeError, "no class 'Nope'"),
        ("json:dumps", AttributeError, "no class 'dumps'"),
        ("missing_dir/none.py:P", FileNotFoundError, "file not found: none.py"),
    ],
)
def test_bad_entries_name_what_is_wrong(entry: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        import_class(entry)


def test_a_package_module_is_imported_by_name() -> None:
    assert import_class("collections:OrderedDict").__name__ == "OrderedDict"
