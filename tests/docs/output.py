"""Comparing a command's output with the output a page shows.

JSON output is compared as data: ``...`` (bare or quoted) stands for any value, a list
ending in ``...`` for any list that starts with the items before it, an object ending in
``...`` for any object with at least the keys before it, and a number matches to the
digits shown (``0.98`` matches 0.9812). Any other output is compared as text with
doctest's rules: whitespace runs are equal, and ``...`` stands for any text.
"""

from __future__ import annotations

import doctest
import json
import re
from decimal import Decimal
from typing import Any

ELLIPSIS = "..."


class _Shown(float):
    """A float that remembers how many decimals the page wrote."""

    decimals: int

    def __new__(cls, text: str) -> _Shown:
        value = super().__new__(cls, text)
        exponent = Decimal(text).as_tuple().exponent
        value.decimals = -exponent if isinstance(exponent, int) and exponent < 0 else 0
        return value


# A bare ``...`` where a JSON value or a last member would stand.
_BARE_ITEM = re.compile(r"(?<=[\[,:])(\s*)\.\.\.(?=\s*[\]},])")
_BARE_MEMBER = re.compile(r",(\s*)\.\.\.(\s*)}")


def _json(text: str, *, shown: bool) -> Any:
    if shown:
        text = _BARE_MEMBER.sub(r',\1"...": "..."\2}', text)
        text = _BARE_ITEM.sub(r'\1"..."', text)
    return json.loads(text, parse_float=_Shown if shown else float)


def _matches(expected: Any, actual: Any) -> bool:
    if expected == ELLIPSIS:
        return True
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    if isinstance(expected, int | float) and isinstance(actual, int | float):
        if isinstance(expected, _Shown):
            return abs(actual - expected) <= 0.5 * 10.0**-expected.decimals + 1e-12
        return expected == actual
    if isinstance(expected, list) and isinstance(actual, list):
        if expected and expected[-1] == ELLIPSIS:
            head = expected[:-1]
            return len(actual) >= len(head) and all(map(_matches, head, actual))
        return len(expected) == len(actual) and all(map(_matches, expected, actual))
    if isinstance(expected, dict) and isinstance(actual, dict):
        keys = expected.keys() - {ELLIPSIS}
        open_ended = ELLIPSIS in expected
        if not (keys <= actual.keys() if open_ended else keys == actual.keys()):
            return False
        return all(_matches(expected[k], actual[k]) for k in keys)
    return bool(expected == actual)


def output_matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` is what the page shows as ``expected`` (see the module doc)."""
    try:
        want = _json(expected, shown=True)
        got = _json(actual, shown=False)
    except ValueError:
        checker = doctest.OutputChecker()
        flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        return checker.check_output(expected.strip() + "\n", actual.strip() + "\n", flags)
    return _matches(want, got)
