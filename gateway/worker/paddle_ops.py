"""Paddle Serving ``Op`` classes as pipeline ops, with their own signatures.

A Paddle op (a ``paddle_serving_server.web_service.Op`` subclass, or any class written the
same way: paddle need not be installed) has::

    def init_op(self): ...
    def preprocess(self, input_dicts, data_id, log_id):
        return feed_dict, is_skip, errcode, errinfo
    def postprocess(self, input_dicts, fetch_dict, data_id, log_id):
        return fetch_dict, errcode, errinfo

:class:`PaddleOp` runs one as the gateway's op contract (gateway/worker/ops.py):
``input_dicts`` is ``{"@DAGExecutor": inputs}`` (the one predecessor Paddle names so for the
request's own inputs; ``(_, input_dict), = input_dicts.items()`` reads it), a text input
arrives as the ``str`` Paddle's key/value form gives (numbers as numpy arrays), ``is_skip``
skips the step's model (the feed dict goes to ``postprocess`` as its fetch dict, as in
Paddle), and an ``errcode`` other than 0/None answers the call with ``errinfo``. A hook that
returns anything but its tuple is a 500 that says what it returned.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from gateway.worker.op_types import OpError, SkipModel

PREDECESSOR = "@DAGExecutor"  # Paddle's name for the request as an op's input
_PRE_ARGS = ("input_dicts", "data_id", "log_id")
_POST_ARGS = ("input_dicts", "fetch_dict", "data_id", "log_id")


def _positional(fn: Any) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return -1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds)


def is_paddle_op(cls: type) -> bool:
    """Whether ``cls`` is written as a Paddle op: it has ``init_op``, or hooks that take
    Paddle's arguments (``preprocess(input_dicts, data_id, log_id)``,
    ``postprocess(input_dicts, fetch_dict, data_id, log_id)``)."""
    if "init_op" in dir(cls):
        return True
    pre, post = (
        inspect.getattr_static(cls, "preprocess", None),
        inspect.getattr_static(cls, "postprocess", None),
    )
    return (pre is not None and _positional(pre) == 1 + len(_PRE_ARGS)) or (
        post is not None and _positional(post) == 1 + len(_POST_ARGS)
    )


def _paddle_value(value: Any) -> Any:
    """A text of one element as the ``str`` Paddle hands an op; anything else as it is."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "OSU" and value.size == 1:
        value = value.reshape(-1)[0]
    elif isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, bytes)):
        value = value[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _failed(errcode: Any, errinfo: Any, hook: str) -> None:
    if errcode is not None and errcode != 0:
        raise OpError(f"{hook}() errcode {errcode}: {errinfo}", 400)


class PaddleOp:
    """A Paddle op instance behind the gateway's ``preprocess``/``postprocess`` hooks."""

    def __init__(self, op: Any) -> None:
        self.op = op
        self.name = type(op).__name__
        self._pre = getattr(op, "preprocess", None)
        self._post = getattr(op, "postprocess", None)
        self._ids = itertools.count()
        self.config: dict[str, Any] = {}

    def initialize(self) -> None:
        init = getattr(self.op, "init_op", None)
        if callable(init):
            init()

    def _dicts(self, inputs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        return {PREDECESSOR: {k: _paddle_value(v) for k, v in inputs.items()}}

    def preprocess(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        if self._pre is None:
            return dict(inputs)
        data_id = next(self._ids)
        got = self._pre(self._dicts(inputs), data_id, data_id)
        if not isinstance(got, tuple) or len(got) != 4 or not isinstance(got[0], Mapping):
            want = "(dict, is_skip, errcode, errinfo)"
            raise OpError(f"{self.name}.preprocess() returned {_shape(got)}; expected {want}", 500)
        feed, is_skip, errcode, errinfo = got
        _failed(errcode, errinfo, "preprocess")
        return SkipModel(feed) if is_skip else dict(feed)

    def postprocess(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> dict[str, Any]:
        if self._post is None:
            return dict(outputs)
        data_id = next(self._ids)
        got = self._post(self._dicts(inputs), dict(outputs), data_id, data_id)
        if not isinstance(got, tuple) or len(got) != 3 or not isinstance(got[0], Mapping):
            raise OpError(
                f"{self.name}.postprocess() returned {_shape(got)}; expected (dict, errcode, errinfo)", 500
            )
        fetch, errcode, errinfo = got
        _failed(errcode, errinfo, "postprocess")
        return dict(fetch)

    def close(self) -> None:
        close = getattr(self.op, "close", None)
        if callable(close):
            close()


def _shape(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    return type(value).__name__


__all__ = ["PREDECESSOR", "PaddleOp", "is_paddle_op"]
