"""Python ops and the built-in transforms a pipeline step runs (in the gateway's threads, or an
op alone on its own worker processes: gateway/worker/processors/op.py).

A Python op is a class (``op: path/to/file.py:Class`` or ``package.module:Class``) with
either or both hooks, in the shape of a Paddle Serving op or a KServe transformer::

    class Tokenize:
        def initialize(self) -> None: ...                  # optional; self.config is set
        def preprocess(self, inputs: dict) -> dict: ...    # before the step's model
        def postprocess(self, inputs: dict, outputs: dict) -> dict: ...  # after it

On a step with a model, ``preprocess`` turns the step's inputs into the model's feeds and
``postprocess`` turns the model's outputs (with the step's inputs at hand) into the step's
outputs; a ``SkipModel`` from ``preprocess`` skips the model and is handed on in place of
its outputs. On a step without one, ``preprocess``'s answer is handed to ``postprocess`` as
its outputs. A class written as a Paddle Serving ``Op`` (``init_op``,
``preprocess(input_dicts, data_id, log_id)``, ...) runs through gateway.worker.paddle_ops.
Values are numpy arrays or plain Python values; nothing is serialised between steps in this
process. ``OpError(message, status)`` answers the request with that status;
any other exception is a 500 that names the step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gateway.config.catalog import DTYPES
from gateway.config.image_transforms import IMAGE_TRANSFORMS
from gateway.config.user_code import import_class
from gateway.worker.image_ops import image_transform
from gateway.worker.op_types import OpError, SkipModel
from gateway.worker.paddle_ops import PaddleOp, is_paddle_op

# V2 datatype -> numpy dtype for ``cast``.
_NUMPY: dict[str, np.dtype[Any]] = {
    "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64), "FP16": np.dtype(np.float16),
    "INT8": np.dtype(np.int8), "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "BOOL": np.dtype(np.bool_),
    "BYTES": np.dtype(object),
}  # fmt: skip


def load_op(entry: str, config: Mapping[str, Any]) -> Any:
    """An initialised instance of the op class ``entry`` names."""
    cls = import_class(entry)
    if is_paddle_op(cls):  # Paddle's signatures, run through an adapter of the same hooks
        paddle_op = PaddleOp(cls())
        paddle_op.config = dict(config)
        paddle_op.initialize()
        return paddle_op
    if not (callable(getattr(cls, "preprocess", None)) or callable(getattr(cls, "postprocess", None))):
        raise TypeError(
            f"entry {entry!r}: class {cls.__name__} has neither preprocess(inputs)"
            " nor postprocess(inputs, outputs)"
        )
    obj = cls()
    obj.config = dict(config)
    init = getattr(obj, "initialize", None)
    if callable(init):
        init()
    return obj


# ----------------------------------------------------------------------------- transforms


def _x(inputs: Mapping[str, Any]) -> np.ndarray:
    return np.asarray(inputs["x"])


def _topk(args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    x = _x(inputs)
    if x.ndim == 0:
        raise OpError("topk needs at least one axis", 500)
    k = min(int(args.get("k", 1)), x.shape[-1])
    # A stable sort of the negated scores: equal scores keep their index order.
    idx = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return {"indices": idx.astype(np.int64), "values": np.take_along_axis(x, idx, axis=-1)}


def _argmax(args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {"index": np.argmax(_x(inputs), axis=-1).astype(np.int64)}


def _softmax(args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    x = _x(inputs)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return {"y": e / np.sum(e, axis=-1, keepdims=True)}


def _label_map(args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    x = _x(inputs)
    labels = np.asarray([str(v) for v in args["labels"]], dtype=object)
    if x.dtype.kind not in "iu":
        raise OpError(f"label_map needs integer indices, got {x.dtype}", 500)
    if x.size and (x.min() < 0 or x.max() >= len(labels)):
        raise OpError(f"label index out of range 0..{len(labels) - 1}", 500)
    return {"label": labels[x]}


def _cast(args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    want = DTYPES.get(str(args["dtype"]).lower()) or str(args["dtype"]).upper()
    return {"y": _x(inputs).astype(_NUMPY[want])}


def _concat(args: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    arrays = [np.asarray(v) for v in inputs.values()]
    try:
        return {"y": np.concatenate(arrays, axis=-1)}
    except ValueError as exc:
        raise OpError(f"cannot concatenate: {exc}", 500) from None


Transform = Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, np.ndarray]]
TRANSFORM_FUNCTIONS: dict[str, Transform] = {
    "topk": _topk,
    "argmax": _argmax,
    "softmax": _softmax,
    "label_map": _label_map,
    "cast": _cast,
    "concat": _concat,
    # Paddle Serving's image preprocessing, on OpenCV (gateway.worker.image_ops).
    **{name: image_transform(name) for name in IMAGE_TRANSFORMS},
}

__all__ = ["TRANSFORM_FUNCTIONS", "OpError", "SkipModel", "Transform", "load_op"]
