"""``eas_prediction.onnx_request`` path."""

from ._proto import onnx_data_pb2 as OnnxData
from .requests.onnx import OnnxRequest, OnnxResponse

__all__ = ["OnnxData", "OnnxRequest", "OnnxResponse"]
