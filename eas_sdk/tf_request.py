"""``eas_prediction.tf_request`` path (the TensorFlow-serving protobuf)."""

from .requests.tf import TFRequest, TFResponse

__all__ = ["TFRequest", "TFResponse"]
