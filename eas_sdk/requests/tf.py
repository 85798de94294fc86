"""TFRequest / TFResponse: the TensorFlow ``PredictRequest``/``PredictResponse`` of PAI-EAS.

Same names, constants, methods and argument order as eas-prediction 0.36, and the same
bytes whenever that client works. Differences (all additive):

* ``add_feed`` also takes numpy arrays of any shape (``shape=None`` uses the array's shape,
  ``content_type=None`` infers the DT code), validates shape vs value count, dtype and
  value types, and raises ValueError/TypeError naming the input;
* ``TFRequest()`` without a signature name works (no signature is sent);
* ``TFResponse.to_numpy(name)`` returns a shaped ndarray (a zero-copy, read-only view for
  float/double outputs); ``get_values`` still returns the flat Python values, and also
  for UINT8/UINT16/QINT outputs where the original returned None.

Compatibility quirks kept on purpose: the signature name is written when ``add_feed`` runs
(as the original did), and feeding the same input name twice appends to its shape and
values, as protobuf's ``extend`` did in the original.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codecs import eas as _t
from .base import ArrayDataTypes, Request, Response, prepare_feed

_TF_KINDS = {v: k for k, v in _t.TF_FIELDS.items()}


class _Feed:
    __slots__ = ("dims", "dtype", "fields")

    def __init__(self) -> None:
        self.dtype = 0
        self.dims: list[int] = []
        self.fields: dict[int, list[Any]] = {}


def _name(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8")
    raise TypeError(f"{what} must be str, got {type(value).__name__}")


class TFRequest(ArrayDataTypes, Request):
    """Request for TensorFlow-style services (protobuf ``PredictRequest``)."""

    # The public docs spell the bool constant TF_BOOL.
    TF_BOOL = _t.DT_BOOL

    def __init__(self, signature_name: str | None = None) -> None:
        self.signature_name = signature_name
        self._wire_signature: str | None = None
        self._inputs: dict[str, _Feed] = {}
        self._fetches: list[str] = []
        self._body: bytes | None = None

    def __repr__(self) -> str:
        feeds = {k: (_t.DT_NAMES.get(f.dtype, f.dtype), f.dims) for k, f in self._inputs.items()}
        return f"TFRequest(signature_name={self.signature_name!r}, inputs={feeds}, fetch={self._fetches})"

    __str__ = __repr__

    def set_signature_name(self, singature_name: str | None) -> None:
        """Set the model signature name (written with the next ``add_feed``, as the original)."""
        self.signature_name = singature_name

    def add_feed(self, input_name: str, shape: Any, content_type: Any, content: Any) -> None:
        """Set input ``input_name``: ``shape`` (or None), a DT code (or None), flat values or an ndarray."""
        name = _name(input_name, "input_name")
        what = f"input {name!r}"
        dt, dims, field, chunks = prepare_feed(what, shape, content_type, content, "tf")
        if self.signature_name is not None:
            _name(self.signature_name, "signature_name")
        feed = self._inputs.get(name)
        if feed is None:
            feed = self._inputs[name] = _Feed()
        feed.dtype = dt
        feed.dims.extend(dims)
        feed.fields.setdefault(field, []).extend(chunks)
        self._wire_signature = self.signature_name
        self._body = None

    def add_fetch(self, output_name: str) -> None:
        """Ask for output ``output_name`` only (repeatable; default is all outputs)."""
        self._fetches.append(_name(output_name, "output_name"))
        self._body = None

    def to_string(self) -> bytes:
        """The serialized ``PredictRequest`` (built once, cached until the request changes)."""
        if self._body is None:
            pieces: list[Any] = []
            if self._wire_signature:
                sig = self._wire_signature.encode("utf-8")
                pieces += [b"\x0a", _t.varint(len(sig)), sig]
            for name, feed in self._inputs.items():
                vp, vs = _t.array_proto(feed.dtype, feed.dims, feed.fields, _TF_KINDS)
                pieces += _t.map_entry(b"\x12", name, vp, vs)[0]
            for out in self._fetches:
                ob = out.encode("utf-8")
                pieces += [b"\x1a", _t.varint(len(ob)), ob]
            self._body = b"".join(pieces)
        return self._body

    @property
    def request_data(self) -> Any:
        """A protobuf ``PredictRequest`` parsed from ``to_string()`` (a snapshot, read-only use)."""
        from .._proto import tf_predict_pb2

        return tf_predict_pb2.PredictRequest.FromString(self.to_string())

    def parse_response(self, response_data: bytes) -> TFResponse:
        return TFResponse(response_data)


class TFResponse(Response):
    """A TensorFlow-style ``PredictResponse``, decoded without copying tensor data."""

    def __init__(self, response_data: bytes | None = None) -> None:
        self.response_data = b"" if response_data is None else response_data
        self._outputs = _t.decode_tf_response(self.response_data)
        self._pb: Any = None

    @property
    def response(self) -> Any:
        """The protobuf ``PredictResponse`` (parsed on first use), as the original exposed."""
        if self._pb is None:
            from .._proto import tf_predict_pb2

            self._pb = tf_predict_pb2.PredictResponse.FromString(bytes(self.response_data))
        return self._pb

    def __str__(self) -> str:
        return str(self.response)

    def to_string(self) -> str:
        return str(self.response)

    def output_names(self) -> list[str]:
        return list(self._outputs)

    def get_tensor_shape(self, output_name: str) -> list[int]:
        """Shape of an output as a list ([] for an unknown name, as the original)."""
        out = self._outputs.get(output_name)
        return out.shape() if out is not None else []

    def get_values(self, output_name: str) -> list[Any] | None:
        """Flat values of an output as Python numbers/bytes/bools (None if unknown, as the original)."""
        out = self._outputs.get(output_name)
        if out is None:
            return None
        try:
            kind = _t.value_kind(out.dtype, "tf")
        except ValueError:
            return None
        values = out.values(kind)
        return values.tolist() if isinstance(values, np.ndarray) else list(values)

    def to_numpy(self, output_name: str) -> np.ndarray:
        """An output as a shaped ndarray of its dtype; KeyError if absent, ValueError if malformed."""
        out = self._outputs.get(output_name)
        if out is None:
            raise KeyError(f"no output {output_name!r} in response (have {list(self._outputs)})")
        return out.to_tensor(f"output {output_name!r}").array


__all__ = ["TFRequest", "TFResponse"]
