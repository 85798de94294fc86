"""Tensors by name on the worker's TF protobuf path, and the error for a tensor that does not
match its description.

A call with tensors by name (V2 binary and JSON, gRPC, a pipeline's model step) costs a
worker what an EAS ``TFRequest`` costs: :func:`tf_request` builds it and :func:`tf_outputs`
reads the answer back as arrays. The protocol adapters (gateway.codecs) raise
:class:`TensorError` for a client's tensor that does not fit, and answer it in their own shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from eas_sdk.codecs.eas import decode_tf_response, encode_tf_request


class TensorError(ValueError):
    """A tensor that does not match its description: answered 400 in the protocol's own shape."""


def tf_request(inputs: Mapping[str, np.ndarray], outputs: Sequence[str] = ()) -> bytes:
    """A TF ``PredictRequest`` for the onnx processor: inputs by name, an output subset."""
    try:
        return encode_tf_request(None, inputs, outputs)
    except (TypeError, ValueError) as exc:
        raise TensorError(str(exc)) from None


def tf_outputs(reply: bytes, declared: Mapping[str, np.dtype[Any]] | None = None) -> dict[str, np.ndarray]:
    """The arrays of the processor's TF ``PredictResponse``, in the model's own dtypes.

    The TF answer widens a few dtypes for old clients (uint8 travels as int32); ``declared``
    (output name -> the model's dtype) narrows them back so a V2 client sees the model's
    datatype. Raises ValueError on a reply that is not a PredictResponse."""
    arrays: dict[str, np.ndarray] = {}
    for name, raw in decode_tf_response(reply).items():
        arr = raw.to_tensor(f"output {name!r}").array
        want = declared.get(name) if declared else None
        if want is not None and want != arr.dtype and want.kind != "O" and arr.dtype.kind != "O":
            arr = arr.astype(want)
        arrays[name] = arr
    return arrays
