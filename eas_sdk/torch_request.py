"""``eas_prediction.torch_request`` path."""

from .requests.torch import TorchRequest, TorchResponse

__all__ = ["TorchRequest", "TorchResponse"]
