"""Query and header parsing for the queue protocol: every refusal is a ``QueueError`` whose
text names the parameter, e.g. ``400 _index_: expected an unsigned integer, got 'abc'``."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

from multidict import MultiMapping

from eas_sdk._core import constants as C
from gateway.queue.interfaces import RequestLike
from gateway.queue.records import QueueError

U64_MAX = (1 << 64) - 1
MAX_INDEXES = 10_000
MAX_TIMEOUT_S = 60.0
_UINT_RE = re.compile(r"[0-9]{1,20}")
_INDEXES_RE = re.compile(r"[0-9]{1,20}(?:,[0-9]{1,20})*")
_DURATION_RE = re.compile(r"(?:([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def bad(param: str | None, message: str, status: int = 400) -> QueueError:
    return QueueError(status, f"{param}: {message}" if param else message, param)


def parse_uint(value: str, param: str, lo: int = 0, hi: int = U64_MAX) -> int:
    if not _UINT_RE.fullmatch(value):
        raise bad(param, f"expected an unsigned integer, got {value[:40]!r}")
    n = int(value)
    if n < lo or n > hi:
        raise bad(param, f"must be between {lo} and {hi}, got {value[:40]}")
    return n


def parse_indexes(value: str | None, param: str = C.Q_INDEXES) -> list[int]:
    if value is None or value == "":
        raise bad(param, "missing (a comma-separated list of indexes)")
    parts = value.split(",")
    if len(parts) > MAX_INDEXES:
        raise bad(param, f"at most {MAX_INDEXES} indexes per call, got {len(parts)}")
    if _INDEXES_RE.fullmatch(value):  # the usual list, checked in one match (a commit's hot path)
        idxs = list(map(int, parts))
        if 0 not in idxs and max(idxs) <= U64_MAX:
            return idxs
    return [parse_uint(p, param, lo=1) for p in parts]  # names the first bad one


def parse_bool(value: str | None, param: str, default: bool) -> bool:
    if value is None:
        return default
    v = value.lower()
    if v in ("true", "1"):
        return True
    if v in ("false", "0", ""):
        return False
    raise bad(param, f"expected true or false, got {value[:40]!r}")


_DURATIONS: dict[str, float] = {}  # the few distinct values clients send, parsed once


def parse_duration(value: str | None, param: str = C.Q_TIMEOUT, default: float = 0.0) -> float:
    """Go duration (``5s``, ``500ms``, ``1m30s``; a bare ``0`` or integer means seconds), capped at 60 s."""
    if value is None:
        return default
    secs = _DURATIONS.get(value)
    if secs is None:
        secs = _parse_duration(value, param)
        if len(_DURATIONS) < 256:
            _DURATIONS[value] = secs
    return secs


def _parse_duration(value: str, param: str) -> float:
    v = value.strip()
    if _UINT_RE.fullmatch(v):
        secs = float(int(v))
    elif _DURATION_RE.fullmatch(v):
        secs = sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(v))
    else:
        raise bad(param, f"expected a duration such as 5s or 500ms, got {value[:40]!r}")
    return min(secs, MAX_TIMEOUT_S)


def query_dict(query: MultiMapping[str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, val in query.items() if isinstance(query, MultiMapping) else query:
        if key in out:
            raise bad(key, "given more than once")
        out[key] = val
    return out


def split_tags(q: Mapping[str, str], known: AbstractSet[str]) -> dict[str, str]:
    """Tags are the query keys an operation does not use; names starting with '_' are reserved."""
    tags: dict[str, str] = {}
    for key, val in q.items():
        if key in known:
            continue
        if key.startswith("_"):
            raise bad(key, "tag names starting with '_' are reserved")
        if not key:
            raise bad("tags", "empty tag name")
        tags[key] = val
    return tags


def identity(request: RequestLike) -> tuple[str, str]:
    uid = request.headers.get(C.HEADER_QUEUE_UID) or str(uuid.uuid4())
    gid = request.headers.get(C.HEADER_QUEUE_GID) or C.DEFAULT_QUEUE_GROUP
    if len(uid) > 256:
        raise bad(C.HEADER_QUEUE_UID, "longer than 256 characters")
    if len(gid) > 256:
        raise bad(C.HEADER_QUEUE_GID, "longer than 256 characters")
    return uid, gid
