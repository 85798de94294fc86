"""The queue store is composed of parts that each own their state: the record log, the
consumer groups over it and the retention rules, put together by ``store.Queue``. These
checks keep it so: no part inherits another, none reaches into another's private state,
imports run one way (retention and groups never import the store at run time), and no
part keeps state in a module-level registry."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gateway.queue.groups import ConsumerGroups
from gateway.queue.recordlog import RecordLog
from gateway.queue.retention import Retention
from gateway.queue.store import Queue

QUEUE = Path(__file__).resolve().parents[3] / "gateway" / "queue"
PARTS = ["durable", "recordlog", "groups", "retention", "store"]
# What each part may import of the others at run time (TYPE_CHECKING imports aside).
BELOW = {
    "durable": set(),
    "recordlog": {"durable"},
    "groups": {"durable", "recordlog"},
    "retention": {"durable"},
    "store": {"durable", "recordlog", "groups", "retention"},
}


def _tree(part: str) -> ast.Module:
    return ast.parse((QUEUE / f"{part}.py").read_text(encoding="utf-8"))


def test_the_parts_are_composed_not_inherited() -> None:
    for cls in (Queue, RecordLog, ConsumerGroups, Retention):
        assert cls.__mro__ == (cls, object), cls


@pytest.mark.parametrize("part", PARTS)
def test_a_part_touches_no_private_name_of_another_object(part: str) -> None:
    private = [
        f"{part}.py:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(_tree(part))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]
    assert private == []


@pytest.mark.parametrize("part", PARTS)
def test_imports_between_the_parts_run_one_way(part: str) -> None:
    tree = _tree(part)
    guarded = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 1 and id(node) not in guarded
    }
    assert imported & set(PARTS) <= BELOW[part]


@pytest.mark.parametrize("part", PARTS)
def test_no_part_keeps_state_at_module_level(part: str) -> None:
    """A module-level dict, set, list or weak mapping would outlive the queues it serves
    and be shared by all of them."""
    mutable = (ast.Dict, ast.Set, ast.List, ast.DictComp, ast.SetComp, ast.ListComp)
    registries = []
    for node in _tree(part).body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if [ast.unparse(t) for t in targets] == ["__all__"]:
            continue
        value = node.value
        made = isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in {
            "dict",
            "set",
            "list",
            "defaultdict",
            "OrderedDict",
            "WeakKeyDictionary",
            "WeakValueDictionary",
            "WeakSet",
        }
        if isinstance(value, mutable) or made:
            registries.append(f"{part}.py:{node.lineno}: {ast.unparse(node)[:80]}")
    assert registries == []
