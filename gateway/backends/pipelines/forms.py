"""The forms a model step speaks to another service's workers, by the service's processor.

A model service (``onnx``, ``sklearn``, ``xgboost``, ``lightgbm``) gets the TF
``PredictRequest`` (its cheapest form: raw tensor bytes, see gateway.codecs.v2_tensors). A
``python`` service runs user code that reads the raw body, so it gets the gateway's self-
describing JSON form (docs/processors.md, the form the Paddle and KServe adapters hand a
processor): ``{"inputs": {name: {"shape", "dtype", "data"}}, "outputs": [...]}`` with the
header ``X-Eas-Request-Format: json``; it answers ``{"outputs": {name: {"dtype", "shape",
"data"}}}``, as the ``onnx`` processor does. Plain JSON, so a predictor needs nothing of the
gateway to read it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from eas_sdk.codecs.eas.decoded import dtype_name
from gateway.codecs import pipeline_values as values
from gateway.config.catalog import MODEL_PROCESSORS
from gateway.core.dataplane import JSON_FORM_HEADERS, TF_FORM_HEADERS

# The processors a model step can call, and the form each one gets.
STEP_FORMS = {**dict.fromkeys(MODEL_PROCESSORS, "tf"), "python": "json"}
FORM_HEADERS = {
    "tf": TF_FORM_HEADERS,
    "json": JSON_FORM_HEADERS,
    # An op on worker processes of its own: named values (gateway.codecs.pipeline_values).
    "values": {"Content-Type": values.CONTENT_TYPE},
}


def _data(arr: np.ndarray) -> list[Any]:
    if arr.dtype.kind in "OUS":
        items = arr.ravel().tolist()
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in items]
    flat = arr.astype(np.float32).ravel() if arr.dtype == np.float16 else arr.ravel()
    values = flat.tolist()
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():
        return [v if math.isfinite(v) else None for v in values]  # JSON has no NaN: null
    return values


def json_request(feeds: Mapping[str, np.ndarray], wanted: Sequence[str] = ()) -> bytes:
    """The JSON form of a call: every input with its shape and dtype, the outputs wanted."""
    doc = {
        "inputs": {
            name: {"shape": list(arr.shape), "dtype": dtype_name(arr.dtype), "data": _data(arr)}
            for name, arr in feeds.items()
        },
        "outputs": list(wanted),
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def json_outputs(reply: bytes) -> dict[str, np.ndarray]:
    """The arrays of a JSON-form answer; ValueError (or TypeError) when it is not one."""
    doc = json.loads(reply)
    outputs = doc.get("outputs") if isinstance(doc, dict) else None
    if not isinstance(outputs, dict):
        raise ValueError('no "outputs" object')
    arrays: dict[str, np.ndarray] = {}
    for name, t in outputs.items():
        if not isinstance(t, dict) or "data" not in t:
            raise ValueError(f'output {name!r}: expected {{"dtype", "shape", "data"}}')
        dtype = t.get("dtype")
        data = t["data"]
        if dtype in ("string", "bytes", "BYTES"):
            arr = np.asarray(data, dtype=object)
        else:
            arr = np.asarray(data, dtype=np.dtype(dtype) if dtype else None)
        shape = t.get("shape")
        arrays[name] = arr.reshape(shape) if shape is not None else arr
    return arrays


__all__ = ["FORM_HEADERS", "STEP_FORMS", "json_outputs", "json_request"]
