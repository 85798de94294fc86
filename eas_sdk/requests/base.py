"""Common base of every request and response type.

A predict client only needs two methods: ``req.to_string()`` (the body, bytes; a
StringRequest may return the str it was given) and ``req.parse_response(body)``.
``to_bytes()`` is the same body, always as bytes. ``content_type`` is None, meaning
"the client's default" (application/octet-stream), exactly as eas-prediction sends.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np

from ..codecs import eas as _t


class ArrayDataTypes:
    """The 22 ``DT_*`` codes shared by TF and PyTorch requests (same values on the wire)."""

    DT_INVALID = _t.DT_INVALID
    DT_FLOAT = _t.DT_FLOAT
    DT_DOUBLE = _t.DT_DOUBLE
    DT_INT32 = _t.DT_INT32
    DT_UINT8 = _t.DT_UINT8
    DT_INT16 = _t.DT_INT16
    DT_INT8 = _t.DT_INT8
    DT_STRING = _t.DT_STRING
    DT_COMPLEX64 = _t.DT_COMPLEX64
    DT_INT64 = _t.DT_INT64
    DT_BOOL = _t.DT_BOOL
    DT_QINT8 = _t.DT_QINT8
    DT_QUINT8 = _t.DT_QUINT8
    DT_QINT32 = _t.DT_QINT32
    DT_BFLOAT16 = _t.DT_BFLOAT16
    DT_QINT16 = _t.DT_QINT16
    DT_QUINT16 = _t.DT_QUINT16
    DT_UINT16 = _t.DT_UINT16
    DT_COMPLEX128 = _t.DT_COMPLEX128
    DT_HALF = _t.DT_HALF
    DT_RESOURCE = _t.DT_RESOURCE
    DT_VARIANT = _t.DT_VARIANT


class Request(abc.ABC):
    """A request body plus the way to read its response."""

    content_type: ClassVar[str | None] = None

    @abc.abstractmethod
    def to_string(self) -> bytes | str:
        """The serialized request body (cached; repeated calls return equal bytes)."""

    @abc.abstractmethod
    def parse_response(self, response_data: bytes) -> Response:
        """Wrap a 200 response body in the matching Response type."""

    def to_bytes(self) -> bytes:
        """The request body as bytes (str bodies are UTF-8 encoded)."""
        data = self.to_string()
        if isinstance(data, str):
            return data.encode("utf-8")
        return bytes(data)


class Response(abc.ABC):
    """A parsed response body."""

    @abc.abstractmethod
    def to_numpy(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """One output as a shaped ndarray."""


class InvalidInputError(ValueError, AssertionError):
    """A request input fails validation.

    Also an AssertionError, because eas-prediction's BladeRequest raised AssertionError for
    these cases and callers may still catch that.
    """


class InvalidInputTypeError(TypeError, AssertionError):
    """A request input has the wrong Python type (see InvalidInputError)."""


class UnknownOutputError(KeyError, AssertionError):
    """A response has no output of that name (AssertionError for eas-prediction compatibility)."""


def resolve_dtype(content_type: Any, content: Any, family: str, what: str) -> int:
    """A validated DT code: an int code, a numpy dtype-like, or None to infer from ``content``."""
    if content_type is None:
        if isinstance(content, np.ndarray):
            src = content.dtype
        elif isinstance(content, (list, tuple)) and content and isinstance(content[0], (bytes, bytearray)):
            src = np.dtype(object)
        else:
            try:
                src = np.asarray(content).dtype
            except (TypeError, ValueError) as exc:
                raise InvalidInputTypeError(f"{what}: cannot infer a dtype: {exc}") from None
        try:
            return _t.dt_for_numpy(src, family)
        except (TypeError, KeyError):
            raise InvalidInputTypeError(f"{what}: no EAS dtype for numpy dtype {src}") from None
    if isinstance(content_type, (int, np.integer)) and not isinstance(content_type, bool):
        dt = int(content_type)
        try:
            _t.value_kind(dt, family)
        except ValueError:
            names = _t.BLADE_DT_NAMES if family == "blade" else _t.DT_NAMES
            label = names.get(dt, "unknown")
            raise InvalidInputError(f"{what}: unsupported dtype {content_type!r} ({label})") from None
        return dt
    try:
        np_dtype = np.dtype(content_type)
    except TypeError:
        raise InvalidInputTypeError(f"{what}: unknown dtype {content_type!r}") from None
    try:
        return _t.dt_for_numpy(np_dtype, family)
    except (TypeError, KeyError):
        raise InvalidInputTypeError(f"{what}: no EAS dtype for numpy dtype {np_dtype}") from None


def prepare_feed(
    what: str, shape: Any, content_type: Any, content: Any, family: str
) -> tuple[int, list[int], int, list[Any]]:
    """Validate one input and convert it: (dt, dims, value field number, payload chunks).

    ``shape=None`` takes the shape from an ndarray (or nested list) ``content``; otherwise the
    shape's element count must equal the number of values. Strings must be bytes.
    """
    dt = resolve_dtype(content_type, content, family, what)
    kind = _t.value_kind(dt, family)
    try:
        values = _t.to_wire_values(content, kind, what)
        if shape is None:
            if isinstance(content, np.ndarray):
                shape = content.shape
            elif kind == _t.KIND_BYTES:
                shape = [len(values)]
            else:
                shape = np.shape(content)
        dims = _t.check_shape(shape, what)
    except TypeError as exc:
        raise InvalidInputTypeError(str(exc)) from None
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    n = len(values)
    need = _t.shape_size(dims)
    if need != n:
        raise InvalidInputError(f"{what}: shape {dims} needs {need} values, got {n}")
    payload = _t.wire_payload(values, kind)
    chunks = list(payload) if isinstance(payload, list) else [payload]
    return dt, dims, _t.FIELDS[family][kind], chunks


__all__ = [
    "InvalidInputError",
    "InvalidInputTypeError",
    "Request",
    "Response",
    "UnknownOutputError",
    "prepare_feed",
    "resolve_dtype",
]
