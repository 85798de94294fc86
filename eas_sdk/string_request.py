"""``eas_prediction.string_request`` path."""

from .requests.string import StringRequest, StringResponse

__all__ = ["StringRequest", "StringResponse"]
