"""KServe's V1 REST protocol (``:predict`` with instances or inputs) over an onnx service.

Parsing and answer building only (no I/O). A V1 request becomes one request in the onnx
processor's JSON form (docs/processors.md), so it runs on the same workers, with the same
dtype and shape checks, as an EAS call; the processor's outputs become the
``{"predictions": [...]}`` answer, refused (413) before it is built past the response
limit. Errors are :class:`KServeRequestError` (``{"error"}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gateway.codecs.kserve import KServeRequestError, dumps, loads
from gateway.core import json_answer

if TYPE_CHECKING:
    from gateway.core.metadata import ModelMetadata

MAX_INSTANCES = 4096


@dataclass(frozen=True)
class V1Request:
    size: int
    body: bytes  # the onnx processor's JSON request


def parse_v1_predict(body: bytes, sig: ModelMetadata) -> V1Request:
    """``{"instances": [...]}`` (row form): one instance per row; for a single-input model an
    instance is that input's row, otherwise an object naming every input. ``{"inputs": ...}``
    (column form, as TensorFlow Serving and KServe accept it): a list of rows for a
    single-input model, or an object naming every input with its list of rows."""
    doc = loads(body)
    if not isinstance(doc, dict):
        doc = {}
    key = "inputs" if "inputs" in doc and "instances" not in doc else "instances"
    if key == "inputs" and isinstance(doc["inputs"], dict):
        return _v1_columns(doc["inputs"], sig)
    instances = doc.get(key)
    if not isinstance(instances, list) or not instances:
        raise KServeRequestError('body must be a JSON object with a non-empty "instances" or "inputs" list')
    if len(instances) > MAX_INSTANCES:
        raise KServeRequestError(f'"{key}" has more than {MAX_INSTANCES} entries', 413)
    names = [t.name for t in sig.inputs]
    named = all(isinstance(inst, dict) for inst in instances)
    if not named:
        if len(names) != 1:
            raise KServeRequestError(
                f"the model has inputs {names}: each instance must be an object naming every input"
            )
        if any(isinstance(inst, dict) for inst in instances):
            raise KServeRequestError("instances must all be objects or all be values")
        return V1Request(len(instances), dumps({"inputs": {names[0]: instances}}))
    columns: dict[str, list[Any]] = {n: [] for n in names}
    for i, inst in enumerate(instances):
        if set(inst) != set(names):
            raise KServeRequestError(f"instances[{i}]: names inputs {sorted(inst)}, the model has {names}")
        for n in names:
            columns[n].append(inst[n])
    return V1Request(len(instances), dumps({"inputs": columns}))


def _v1_columns(inputs: dict[str, Any], sig: ModelMetadata) -> V1Request:
    """The column form naming every input: each value is that input's list of rows."""
    names = [t.name for t in sig.inputs]
    if set(inputs) != set(names):
        raise KServeRequestError(f'"inputs" names {sorted(inputs)}, the model has {names}')
    sizes = {len(v) if isinstance(v, list) else -1 for v in inputs.values()}
    if len(sizes) != 1 or min(sizes) < 1:
        raise KServeRequestError('every input in "inputs" must be a non-empty list of rows of one length')
    size = sizes.pop()
    if size > MAX_INSTANCES:
        raise KServeRequestError(f'"inputs" has more than {MAX_INSTANCES} rows', 413)
    return V1Request(size, dumps({"inputs": {n: inputs[n] for n in names}}))


def v1_predictions(req: V1Request, outputs: Mapping[str, np.ndarray], limit: int = 0) -> bytes | bytearray:
    """One prediction per instance: the output's row for a single-output model, else
    ``{output: row}``. An output whose first dimension is not the batch is repeated whole.
    Written straight from the arrays (floats in their shortest form, as the processor's JSON
    form has them); json_answer.AnswerTooLarge when it would pass ``limit`` bytes."""
    rows: dict[str, list[Any]] = {}
    for name, arr in outputs.items():
        if arr.ndim and arr.shape[0] == req.size:
            rows[name] = [arr[k : k + 1].reshape(arr.shape[1:]) for k in range(req.size)]  # views
        else:
            rows[name] = [arr] * req.size
    if len(rows) == 1:
        (only,) = rows.values()
        preds: list[Any] = only
    else:
        preds = [{name: r[k] for name, r in rows.items()} for k in range(req.size)]
    return json_answer.dumps({"predictions": preds}, limit, floats="shortest")


__all__ = ["MAX_INSTANCES", "V1Request", "parse_v1_predict", "v1_predictions"]
