"""The queue protocol's query and header parsing under any input: a value or a 4xx QueueError."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from eas_sdk._core.queue import DataFrame
from gateway.queue import params
from gateway.queue.records import QueueError

_TEXT = st.text(max_size=60) | st.from_regex(r"[0-9.,a-z µ-]{0,40}", fullmatch=True)


def _refused_or(fn: object, *args: object) -> object:
    try:
        return fn(*args)  # type: ignore[operator]
    except QueueError as exc:
        assert 400 <= exc.status < 500
        assert len(str(exc)) < 300  # a message, never the whole hostile value
        return None


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_every_parameter_parser(value: str) -> None:
    n = _refused_or(params.parse_uint, value, "_index_")
    assert n is None or 0 <= n <= params.U64_MAX  # type: ignore[operator]
    got = _refused_or(params.parse_indexes, value)
    assert got is None or len(got) <= params.MAX_INDEXES  # type: ignore[arg-type]
    _refused_or(params.parse_bool, value, "_auto_commit_", False)
    secs = _refused_or(params.parse_duration, value)
    assert secs is None or 0.0 <= secs <= params.MAX_TIMEOUT_S  # type: ignore[operator]


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_TEXT, _TEXT, max_size=6))
def test_tags_from_any_query(query: dict[str, str]) -> None:
    tags = _refused_or(params.split_tags, query, frozenset({"_index_", "_length_"}))
    assert tags is None or isinstance(tags, dict)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_frame_bytes_decode_or_raise_decode_error(raw: bytes) -> None:
    from google.protobuf.message import DecodeError

    try:
        frame = DataFrame.decode(raw)
    except DecodeError:
        return
    assert isinstance(frame.data, bytes) and isinstance(frame.tags, dict)


def _index_by_index(value: str) -> list[int] | str:
    try:
        return [params.parse_uint(p, "_indexes_", lo=1) for p in value.split(",")]
    except QueueError as exc:
        return str(exc)


_INDEX = st.from_regex(r"0|[0-9]{1,21}|1844674407370955161[0-9]|x?", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(_INDEX, min_size=1, max_size=8))
def test_a_list_of_indexes_parses_as_each_index_would(parts: list[str]) -> None:
    """One match checks the usual list; the answer, or the refusal naming the first bad
    index, is the one a check of each index in turn gives."""
    value = ",".join(parts)
    assume(value != "")  # refused as missing before any index is looked at
    try:
        got: list[int] | str = params.parse_indexes(value)
    except QueueError as exc:
        got = str(exc)
    assert got == _index_by_index(value)
