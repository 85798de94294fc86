"""Sphinx configuration for the easkit documentation site (``sphinx-build -W docs OUT``).

The pages are the Markdown files beside this one (MyST); the API reference is read from
the docstrings (autodoc, with napoleon for Google-style sections). Every page in this
folder is part of the site (``index.md`` lists them with a glob), so a new page needs no
registration here.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # document this checkout, not an installed copy
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

project = "easkit"
author = "easkit contributors"
copyright = "easkit contributors"
release = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "config_reference",  # docs/_ext: the configuration reference, from the config schema
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "README.md"]

myst_heading_anchors = 3  # links such as gateway.md#limits
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# A console example whose command spans lines inside quotes (a JSON body) is too much
# for Pygments' shell-session lexer; Sphinx then shows it unhighlighted, which is fine.
suppress_warnings = ["misc.highlighting_failure"]

html_theme = "furo"
html_title = "easkit"
