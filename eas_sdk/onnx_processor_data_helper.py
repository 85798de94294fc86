"""``eas_prediction.onnx_processor_data_helper`` path (``eas_sdk.onnx_data_helper``)."""

from .onnx_data_helper import (
    NP_TYPE_TO_TENSOR_TYPE,
    TENSOR_TYPE_TO_NP_TYPE,
    convert_endian,
    from_array,
    to_array,
)

__all__ = ["NP_TYPE_TO_TENSOR_TYPE", "TENSOR_TYPE_TO_NP_TYPE", "convert_endian", "from_array", "to_array"]
