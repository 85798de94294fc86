"""Request and response types, drop-in compatible with eas-prediction 0.36.

``StringRequest``/``StringResponse``, ``TFRequest``/``TFResponse``,
``TorchRequest``/``TorchResponse`` and ``BladeRequest``/``BladeResponse`` keep the
original's names, constants, methods and bytes; every request provides ``to_string()``
and ``parse_response(body)`` (see ``base.Request``) and every response ``to_numpy(...)``.
Encoding and decoding go through the numpy codec in ``eas_sdk._core.tensor``.
"""

from __future__ import annotations

from .base import InvalidInputError, InvalidInputTypeError, Request, Response, UnknownOutputError
from .blade import BladeRequest, BladeResponse
from .string import StringRequest, StringResponse
from .tf import TFRequest, TFResponse
from .torch import TorchRequest, TorchResponse

__all__ = [
    "BladeRequest",
    "BladeResponse",
    "InvalidInputError",
    "InvalidInputTypeError",
    "Request",
    "Response",
    "StringRequest",
    "StringResponse",
    "TFRequest",
    "TFResponse",
    "TorchRequest",
    "TorchResponse",
    "UnknownOutputError",
]
