"""Paddle Serving's HTTP forms, parsed into the onnx processor's JSON form and answered back.

Two request bodies reach ``POST /<service>/prediction``:

* the web service's feed/fetch form: ``{"feed": [{"x": [...]}, ...], "fetch": ["price"]}``;
  each ``feed`` entry is one instance, stacked into a batch (a ``feed`` mapping is taken as
  already batched). Answer: ``{"result": {"price": [[18.9]]}}``.
* the pipeline web service's key/value form: ``{"key": ["x"], "value": ["0.01, -0.11, ..."]}``;
  each value is text: a JSON array, comma-separated numbers (one instance), or any other
  string (a text or base64 input). Answer: ``{"err_no": 0, "err_msg": "", "key": [...],
  "value": [...]}`` with each output as text (a single value as itself, more as JSON).

Either answer is written straight from the output arrays (gateway.core.json_answer), and
refused with 413 before it is built when it would pass the response limit.

An error is ``{"err_no": <status>, "err_msg": "..."}`` (and empty ``key``/``value`` in the
key/value form) with the same HTTP status, so a client can tell the cause from either
(written by gateway/codecs/errors.py, the gateway's one error renderer).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.core import json_answer

try:  # orjson is part of the gateway extra; the stdlib is the fallback
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only without the extra
    _orjson = None

FEED, KEY_VALUE = "feed", "kv"
# Floats as the processor's JSON form writes them (float32 in its shortest form: 18.901152).
_FLOATS = "shortest"
MAX_INSTANCES = 1 << 16


class PaddleRequestError(ValueError):
    """A body that is neither Paddle form, or a malformed one: answered 400."""

    status = 400


@dataclass
class PaddleRequest:
    form: str  # FEED or KEY_VALUE
    inputs: dict[str, Any]
    fetch: list[str] = field(default_factory=list)

    def json_form(self) -> bytes:
        """The onnx processor's JSON request: ``{"inputs": {name: values}, "outputs": [...]}``."""
        return dumps({"inputs": self.inputs, "outputs": self.fetch})


def dumps(doc: Any) -> bytes:
    if _orjson is not None:
        return _orjson.dumps(doc, option=_orjson.OPT_SERIALIZE_NUMPY)
    return json.dumps(doc, ensure_ascii=False).encode()


def _loads(body: bytes) -> Any:
    try:
        return _orjson.loads(body) if _orjson is not None else json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise PaddleRequestError("the body is not JSON") from None


def _fetch(doc: Mapping[str, Any]) -> list[str]:
    fetch = doc.get("fetch") or []
    if not isinstance(fetch, list) or not all(isinstance(f, str) for f in fetch):
        raise PaddleRequestError("'fetch' must be a list of output names")
    return list(dict.fromkeys(fetch))


def _feed(doc: Mapping[str, Any]) -> PaddleRequest:
    feed = doc["feed"]
    if isinstance(feed, Mapping):  # already a batch: {"x": [[...], [...]]}
        return PaddleRequest(FEED, dict(feed), _fetch(doc))
    if not isinstance(feed, list) or not feed or not all(isinstance(i, Mapping) for i in feed):
        raise PaddleRequestError("'feed' must be a non-empty list of {name: value} instances")
    if len(feed) > MAX_INSTANCES:
        raise PaddleRequestError(f"'feed' holds more than {MAX_INSTANCES} instances")
    names = list(feed[0])
    for i, inst in enumerate(feed):
        if set(inst) != set(names):
            raise PaddleRequestError(f"feed[{i}] names {sorted(inst)}; feed[0] names {sorted(names)}")
    return PaddleRequest(FEED, {n: [inst[n] for inst in feed] for n in names}, _fetch(doc))


def text_value(text: str) -> Any:
    """One instance from a key/value text: a JSON array, numbers separated by commas, or the text."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            return json.loads(stripped)
        except ValueError:
            raise PaddleRequestError(f"value {stripped[:32]!r}... is not a JSON array") from None
    parts = stripped.split(",")
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        return text
    if all(math.isfinite(n) for n in numbers):
        return numbers
    return text


def _key_value(doc: Mapping[str, Any]) -> PaddleRequest:
    keys, values = doc.get("key"), doc.get("value")
    if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != len(values):
        raise PaddleRequestError("'key' and 'value' must be lists of the same length")
    if not all(isinstance(k, str) for k in keys) or not all(isinstance(v, str) for v in values):
        raise PaddleRequestError("'key' and 'value' must hold strings")
    # Each value is one instance: the batch of one it makes.
    return PaddleRequest(
        KEY_VALUE, {k: [text_value(v)] for k, v in zip(keys, values, strict=True)}, _fetch(doc)
    )


def parse(body: bytes) -> PaddleRequest:
    doc = _loads(body)
    if isinstance(doc, Mapping) and "feed" in doc:
        return _feed(doc)
    if isinstance(doc, Mapping) and "key" in doc:
        return _key_value(doc)
    raise PaddleRequestError('expected {"feed": [...], "fetch": [...]} or {"key": [...], "value": [...]}')


def _text(arr: np.ndarray, limit: int) -> str:
    if arr.size == 1:
        item = arr.reshape(-1)[0]
        return item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
    return bytes(json_answer.dumps(arr, limit, floats=_FLOATS)).decode()


def answer(req: PaddleRequest, outputs: Mapping[str, np.ndarray], limit: int = 0) -> bytes | bytearray:
    """The answer to ``req`` from the processor's output arrays, written straight from them;
    json_answer.AnswerTooLarge when it would pass ``limit`` bytes (0: no limit), before it
    is built when its estimate says so."""
    if req.form == KEY_VALUE:
        size = sum(json_answer.array_estimate(a, _FLOATS) for a in outputs.values())
        json_answer.check(size, limit, "about")
        values = [_text(a, limit) for a in outputs.values()]
        body = dumps({"err_no": 0, "err_msg": "", "key": list(outputs), "value": values})
        json_answer.check(len(body), limit)
        return body
    return json_answer.dumps({"result": dict(outputs)}, limit, floats=_FLOATS)


def form_of(body: bytes) -> str:
    """The form a body seems to be in, for an error's shape (the feed form when unsure)."""
    return KEY_VALUE if b'"key"' in body[:4096] and b'"feed"' not in body[:4096] else FEED


__all__ = [
    "FEED",
    "KEY_VALUE",
    "PaddleRequest",
    "PaddleRequestError",
    "answer",
    "form_of",
    "parse",
    "text_value",
]
