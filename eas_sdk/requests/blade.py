"""BladeRequest / BladeResponse: the Blade processor's proto2 ``Request``/``Response``.

Same names, constants, methods and argument order as eas-prediction 0.36 and the same bytes
whenever it works. Validation errors are ``InvalidInputError``/``InvalidInputTypeError``
(ValueError/TypeError that are also AssertionError, which the original raised), unknown
outputs raise ``UnknownOutputError`` (KeyError and AssertionError).

Additions: ``BladeRequest()`` without a signature name works (no signature is sent), numpy
arrays of any shape (``shape=None``), DT inference (``content_type=None``), scalar content
for every dtype, DT_INT64 scalars (a typo broke them in the original), and
``BladeResponse.to_numpy(name, output_type=None)``. DT_STRING values must be bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codecs import eas as _t
from .base import (
    InvalidInputError,
    InvalidInputTypeError,
    Request,
    Response,
    UnknownOutputError,
    prepare_feed,
)


class BladeRequest(Request):
    """Request for Blade-optimised services (protobuf ``blade.Request``)."""

    DT_UNKNOWN = _t.BLADE_DT_UNKNOWN
    DT_FLOAT = _t.BLADE_DT_FLOAT
    DT_INT32 = _t.BLADE_DT_INT32
    DT_INT64 = _t.BLADE_DT_INT64
    DT_STRING = _t.BLADE_DT_STRING

    def __init__(self, signature_name: str | None = None) -> None:
        self._inputs: list[bytes] = []
        self._input_names: list[str] = []
        self._output_info: list[bytes] = []
        self._body: bytes | None = None
        self.set_signature_name(signature_name)

    def __repr__(self) -> str:
        return (
            f"BladeRequest(signature_name={self.tf_signature_name!r}, inputs={self._input_names}, "
            f"outputs={len(self._output_info)})"
        )

    __str__ = __repr__

    def set_signature_name(self, signature_name: str | None) -> None:
        """Set the TensorFlow signature name (None: not sent)."""
        if signature_name is not None and not isinstance(signature_name, str):
            raise InvalidInputTypeError(f"signature_name must be str, got {type(signature_name).__name__}")
        self.tf_signature_name = signature_name
        self._body = None

    @staticmethod
    def volume(shape: Any) -> int:
        return _t.shape_size(_t.check_shape(shape))

    def add_feed(self, input_name: str, batchsize: int, shape: Any, content_type: Any, content: Any) -> None:
        """Append input ``input_name`` with its batch size, shape (or None), DT code and values."""
        if not input_name:
            raise InvalidInputError('"input name" can not be empty')
        if not isinstance(input_name, str):
            raise InvalidInputTypeError(f"input name must be str, got {type(input_name).__name__}")
        what = f"input {input_name!r}"
        if isinstance(batchsize, bool) or not isinstance(batchsize, (int, np.integer)) or batchsize <= 0:
            raise InvalidInputError(f"{what}: invalid batchsize value: {batchsize!r}")
        self._append(input_name, int(batchsize), shape, content_type, content)

    def _append(
        self, input_name: str, batchsize: int | None, shape: Any, content_type: Any, content: Any
    ) -> None:
        what = f"input {input_name!r}"
        _dt, dims, field, chunks = prepare_feed(what, shape, content_type, content, "blade")
        if batchsize is None:  # blade_tf_request: the batch is the first dimension
            if not dims:
                raise InvalidInputError(f"{what}: a shape with a first (batch) dimension is required")
            batchsize = dims[0]
        if batchsize > _t.INT32_MAX:
            raise InvalidInputError(f"{what}: batchsize {batchsize} out of int32 range")
        pieces, _ = _t.blade_array(input_name, batchsize, dims, {field: chunks})
        self._inputs.append(b"".join([b"\x12", _t.varint(sum(len(p) for p in pieces)), *pieces]))
        self._input_names.append(input_name)
        self._body = None

    def add_fetch(self, output_name: str, output_type: int) -> None:
        """Ask for output ``output_name`` of Blade DT ``output_type``."""
        if not output_name:
            raise InvalidInputError('"output name" can not be empty')
        if not isinstance(output_name, str):
            raise InvalidInputTypeError(f"output name must be str, got {type(output_name).__name__}")
        if isinstance(output_type, bool) or output_type not in _t.BLADE_DT_NAMES:
            raise InvalidInputError(f"output {output_name!r}: unknown data_type {output_type!r}")
        info = _t.output_info_bytes(output_name, int(output_type))
        self._output_info.append(b"\x1a" + _t.varint(len(info)) + info)
        self._body = None

    def to_string(self) -> bytes:
        """The serialized ``blade.Request`` (cached until the request changes)."""
        if self._body is None:
            pieces: list[bytes] = []
            if self.tf_signature_name is not None:
                sig = self.tf_signature_name.encode("utf-8")
                pieces += [b"\x0a", _t.varint(len(sig)), sig]
            pieces += self._inputs
            pieces += self._output_info
            self._body = b"".join(pieces)
        return self._body

    @property
    def request_data(self) -> Any:
        """A protobuf ``blade.Request`` parsed from ``to_string()`` (a snapshot)."""
        from .._proto import blade_pb2

        return blade_pb2.Request.FromString(self.to_string())

    def parse_response(self, response_data: bytes) -> BladeResponse:
        return BladeResponse(response_data)


class BladeResponse(Response):
    """A Blade ``Response``; outputs are found by ``name_in_dl_model`` (whitespace-stripped)."""

    def __init__(self, response_data: bytes | None = None) -> None:
        self.response_data = b"" if response_data is None else response_data
        self._outputs = _t.decode_blade_response(self.response_data)
        self._pb: Any = None

    @property
    def response(self) -> Any:
        """The protobuf ``blade.Response`` (parsed on first use), as the original exposed."""
        if self._pb is None:
            from .._proto import blade_pb2

            self._pb = blade_pb2.Response.FromString(bytes(self.response_data))
        return self._pb

    def __str__(self) -> str:
        return str(self.response)

    def output_names(self) -> list[str]:
        return [o.name_in_dl_model for o in self._outputs]

    def _find(self, output_name: str) -> _t.RawArray:
        want = str(output_name).strip()
        for out in self._outputs:
            if str(out.name_in_dl_model).strip() == want:
                return out
        raise UnknownOutputError(f'Unknown output name: "{output_name}"')

    @staticmethod
    def _check_type(output_type: Any) -> None:
        if isinstance(output_type, bool) or output_type not in _t.BLADE_DT_NAMES:
            raise InvalidInputError(f'Unknown data_type: "{output_type}"')

    def get_tensor_shape(self, output_name: str) -> list[int]:
        """Shape of an output (UnknownOutputError if absent)."""
        return self._find(output_name).shape()

    def get_values(self, output_name: str, output_type: int) -> list[Any]:
        """Flat values of an output read from the field of ``output_type`` (DT_UNKNOWN: inferred)."""
        self._check_type(output_type)
        out = self._find(output_name)
        dt = output_type or out.blade_dtype() or _t.BLADE_DT_FLOAT
        values = out.values(_t.BLADE_KINDS[dt])
        return values.tolist() if isinstance(values, np.ndarray) else list(values)

    def to_numpy(self, output_name: str, output_type: int | None = None) -> np.ndarray:
        """An output as a shaped ndarray (dtype inferred from the field used unless given)."""
        if output_type is not None:
            self._check_type(output_type)
        out = self._find(output_name)
        return out.to_tensor(f"output {output_name!r}", dtype=output_type or None).array


class BladeTFRequest(BladeRequest):
    """``eas_prediction.blade_tf_request.TFRequest``: Blade messages behind the TFRequest API.

    ``add_feed(input_name, shape, content_type, content)`` takes the batch size from
    ``shape[0]``; ``add_fetch(output_name)`` asks for DT_UNKNOWN. Content types are Blade DT codes.
    """

    def add_feed(self, input_name: str, shape: Any, content_type: Any, content: Any) -> None:  # type: ignore[override]
        if not input_name:
            raise InvalidInputError('"input name" can not be empty')
        if not isinstance(input_name, str):
            raise InvalidInputTypeError(f"input name must be str, got {type(input_name).__name__}")
        self._append(input_name, None, shape, content_type, content)

    def add_fetch(self, output_name: str, output_type: int = _t.BLADE_DT_UNKNOWN) -> None:
        super().add_fetch(output_name, output_type)

    def parse_response(self, response_data: bytes) -> BladeTFResponse:
        return BladeTFResponse(response_data)


class BladeTFResponse(BladeResponse):
    """``blade_tf_request.TFResponse``: ``get_values(name)`` reads whichever value field is filled."""

    def get_values(self, output_name: str, output_type: int = _t.BLADE_DT_UNKNOWN) -> list[Any]:
        return super().get_values(output_name, output_type)


__all__ = ["BladeRequest", "BladeResponse", "BladeTFRequest", "BladeTFResponse"]
