"""The comparison of a command's output with the output a page shows."""

from __future__ import annotations

import pytest

from tests.docs.output import output_matches


@pytest.mark.parametrize(
    ("shown", "printed"),
    [
        ('{"a": [0.98, ...], "b": 1}', '{"b": 1, "a": [0.9812, 3, 4]}'),
        ('{"a": 1, ...}', '{"a": 1, "c": 2}'),
        ('{"id": "..."}', '{"id": "x7"}'),
        ("[1, 2, ...]", "[1, 2, 3]"),
        ("[...]", "[]"),
        ("[0.000]", "[0.0004]"),
        ("hello ... world", "hello   big\nworld"),
    ],
)
def test_what_matches(shown: str, printed: str) -> None:
    assert output_matches(shown, printed)


@pytest.mark.parametrize(
    ("shown", "printed"),
    [
        ('{"a": [0.98, ...]}', '{"a": [0.97]}'),
        ('{"a": 1, ...}', '{"b": 1}'),
        ('{"a": 1}', '{"a": 1, "c": 2}'),
        ("[1, 2]", "[1, 2, 3]"),
        ("[1, 2, ...]", "[1]"),
        ("[0]", "[0.0004]"),
        ("[true]", "[1]"),
        ("hello world", "hello big world"),
        ('{"a": 1}', "not json"),
    ],
)
def test_what_does_not(shown: str, printed: str) -> None:
    assert not output_matches(shown, printed)
