"""``eas_prediction.blade_request`` path."""

from .requests.blade import BladeRequest, BladeResponse

__all__ = ["BladeRequest", "BladeResponse"]
