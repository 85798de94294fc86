"""Request and response types, drop-in compatible with eas-prediction 0.36.

``StringRequest``/``StringResponse``, ``TFRequest``/``TFResponse``,
``TorchRequest``/``TorchResponse``, ``BladeRequest``/``BladeResponse`` and
``BladeTFRequest``/``BladeTFResponse`` (eas-prediction's ``blade_tf_request``) keep the
original's names, constants, methods and bytes; every request provides ``to_string()``
and ``parse_response(body)`` (see ``base.Request``) and every response ``to_numpy(...)``.
Encoding and decoding go through the numpy codec in ``eas_sdk.codecs.eas``.
"""

from __future__ import annotations

from .base import InvalidInputError, InvalidInputTypeError, Request, Response, UnknownOutputError
from .blade import BladeRequest, BladeResponse, BladeTFRequest, BladeTFResponse
from .onnx import OnnxRequest, OnnxResponse
from .string import StringRequest, StringResponse
from .tf import TFRequest, TFResponse
from .torch import TorchRequest, TorchResponse

__all__ = [
    "BladeRequest",
    "BladeResponse",
    "BladeTFRequest",
    "BladeTFResponse",
    "InvalidInputError",
    "InvalidInputTypeError",
    "OnnxRequest",
    "OnnxResponse",
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
