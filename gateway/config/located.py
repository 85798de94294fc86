"""YAML read with the line of every mapping key, so that an error about a key (a misspelt
one) can say where in the file it is. A leaf module: gateway.config.values reads the lines."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml


class Located(dict[Any, Any]):
    """A mapping read from a file that knows the line (1-based) of each of its keys."""

    lines: dict[Any, int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lines = {}


def line_of(raw: Any, key: Any) -> int | None:
    """The line ``key`` of ``raw`` is on, when ``raw`` was read from a file."""
    return raw.lines.get(key) if isinstance(raw, Located) else None


def relocated(source: Any, target: dict[Any, Any]) -> dict[Any, Any]:
    """``target`` (a mapping made from ``source``) with ``source``'s key lines, where it had any."""
    if not isinstance(source, Located):
        return target
    out = Located(target)
    out.lines = {k: v for k, v in source.lines.items() if k in out}
    return out


class _Loader(yaml.SafeLoader):
    pass


def _mapping(loader: _Loader, node: yaml.MappingNode) -> Iterator[Located]:
    data = Located()
    yield data  # first, as SafeLoader does: a mapping may refer to itself through an anchor
    data.update(loader.construct_mapping(node))
    for key_node, _ in node.value:
        try:
            key = loader.construct_object(key_node)
            data.lines.setdefault(key, key_node.start_mark.line + 1)
        except (TypeError, yaml.YAMLError):  # an unhashable key: construct_mapping refused it already
            continue


_Loader.add_constructor("tag:yaml.org,2002:map", _mapping)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, with every mapping a :class:`Located`."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


__all__ = ["Located", "line_of", "load_yaml", "relocated"]
