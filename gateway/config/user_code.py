"""Importing the user's classes named as ``path/to/file.py:Class`` or ``package.module:Class``.

Python processors and pipeline ops are both named this way; a file is imported once per
process (ops are instantiated once per thread) under a module name derived from its full
path, so two ``ops.py`` files in different folders stay two modules.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ENTRY_FORMS = "'path/to/file.py:Class' or 'package.module:Class'"


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path.name}")
    # Sibling modules of the file are importable, as in an EAS processor directory.
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    digest = hashlib.sha1(str(path).encode(), usedforsecurity=False).hexdigest()[:10]
    name = f"easgw_user_{path.stem}_{digest}"
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path.name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # a failed import is tried afresh next time
        raise
    return module


def import_class(entry: str) -> type:
    """The class ``entry`` names; ``ValueError`` for a malformed entry, import errors as raised."""
    target, sep, cls_name = entry.rpartition(":")
    if not sep or not target or not cls_name:
        raise ValueError(f"entry {entry!r}: expected {ENTRY_FORMS}")
    if target.endswith(".py"):
        module = _import_file(Path(target).resolve())
    else:
        module = importlib.import_module(target)
    cls = getattr(module, cls_name, None)
    if not isinstance(cls, type):
        raise AttributeError(f"entry {entry!r}: no class {cls_name!r}")
    return cls


__all__ = ["ENTRY_FORMS", "import_class"]
