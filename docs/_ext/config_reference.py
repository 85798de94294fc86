"""The ``config-reference`` directive: a table of every configuration key, built from the
gateway's config schema (the dataclasses in ``gateway/config.py``) when the site is built.

Names, types and defaults come from the schema, so the table cannot fall behind the code;
what each key means comes from the key tables of ``gateway.md`` (its ``gateway`` and
``services[]`` sections). A key the schema has and ``gateway.md`` does not explain, or a key
``gateway.md`` explains that the schema lacks, is a build warning, which fails the
``sphinx-build -W`` run of the test suite.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from gateway import config as gateway_config
from gateway.config import GatewayConfig, ServiceConfig
from gateway.config.placement import DEFAULT_PLACEMENT

log = logging.getLogger(__name__)

# Field names that differ from the YAML keys.
_YAML_NAMES = {"async_": "async", "extra_tokens": "tokens"}
# Fields that are no YAML key of their own (``env_pass`` is read from ``env``,
# ``placement_reason`` is why ``placement: auto`` chose what it did).
_DERIVED = {"env_pass", "placement_reason"}
# Keys whose default in the file differs from the field's (``auto`` resolves to a placement).
_FILE_DEFAULTS = {"placement": f"`{DEFAULT_PLACEMENT}`"}
# Keys whose value is a structure of its own, described on its own page: one row, no recursion.
_OPAQUE = {"pipeline": "mapping (see pipelines.md)"}
_SECTIONS = {"gateway": ("`gateway`", GatewayConfig), "services": ("`services[]`", ServiceConfig)}
_TYPES = {
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "str": "string",
    "str | None": "string",
    "tuple[str, ...]": "list of strings",
    "Mapping[str, Any]": "mapping",
    "Mapping[str, str]": "mapping of strings",
    "tuple[ModelSource, ...]": "list of mappings",
    "tuple[ScheduledBounds, ...]": "list of mappings (cron, min_workers, max_workers)",
}
_ROW = re.compile(r"^\|\s*`([A-Za-z0-9_.]+)`\s*\|\s*(.*?)\s*\|\s*(.*?)\s*\|\s*$")


def _meanings(page: Path, heading: str) -> dict[str, str]:
    """``key -> meaning`` from the table under ``### <heading>`` in ``page``."""
    rows: dict[str, str] = {}
    inside = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            inside = line.strip() == f"### {heading}"
            continue
        match = _ROW.match(line) if inside else None
        if match:
            # A link to a section of gateway.md must still work from another page.
            rows[match.group(1)] = match.group(3).replace("](#", f"]({page.name}#")
    return rows


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, tuple | list):
        return "`[]`" if not value else f"`{list(value)}`"
    if isinstance(value, dict):
        return "`{}`"
    return f"`{value}`"


def _nested(f: dataclasses.Field[Any]) -> type | None:
    """The config dataclass a field holds (``BatchingConfig``, ``X | None``), if it holds one."""
    names = [part.strip() for part in str(f.type).split("|")]
    found = [getattr(gateway_config, n, None) for n in names if n != "None"]
    return found[0] if len(found) == 1 and dataclasses.is_dataclass(found[0]) else None  # type: ignore[return-value]


def schema_keys(cls: type) -> list[tuple[str, str, str]]:
    """``(yaml key, type, default)`` for every key of a config dataclass, nested ones dotted."""
    out: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(cls):
        if f.name in _DERIVED:
            continue
        key = _YAML_NAMES.get(f.name, f.name)
        if key in _OPAQUE:
            out.append((key, _OPAQUE[key], _default(f)))
            continue
        nested = _nested(f)
        if nested is not None:
            out += [(f"{key}.{k}", t, d) for k, t, d in schema_keys(nested)]
            continue
        out.append((key, _TYPES.get(str(f.type), str(f.type)), _FILE_DEFAULTS.get(key) or _default(f)))
    return out


class ConfigReference(SphinxDirective):
    """``{config-reference} gateway`` or ``services``: the section's table."""

    required_arguments = 1

    def run(self) -> list[Any]:
        heading, cls = _SECTIONS[self.arguments[0]]
        page = Path(self.env.srcdir) / "gateway.md"
        meanings = _meanings(page, heading)
        keys = schema_keys(cls)
        lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
        for key, type_, default in keys:
            meaning = meanings.get(key)
            if meaning is None:
                log.warning("config key %s.%s has no meaning in gateway.md", self.arguments[0], key)
                meaning = ""
            lines.append(f"| `{key}` | {type_} | {default} | {meaning} |")
        for extra in sorted(set(meanings) - {k for k, _, _ in keys}):
            log.warning("gateway.md explains %s.%s, which the config schema does not have", heading, extra)
        self.env.note_dependency(str(page))
        node = self.parse_text_to_nodes("\n".join(lines))
        return list(node)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("config-reference", ConfigReference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
