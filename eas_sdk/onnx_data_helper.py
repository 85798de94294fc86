"""numpy <-> ``TensorProto`` helpers for the HIE ONNX processor format (``OnnxDataHelper``).

Same functions as ``eas_prediction.onnx_processor_data_helper``: tensors carry their
values as little-endian ``raw_data`` bytes, so conversion is one buffer copy each way.
"""

from __future__ import annotations

import numpy as np

from ._proto import onnx_data_pb2 as OnnxData

TENSOR_TYPE_TO_NP_TYPE: dict[int, np.dtype] = {
    int(OnnxData.TensorProto.FLOAT): np.dtype("float32"),
    int(OnnxData.TensorProto.UINT8): np.dtype("uint8"),
    int(OnnxData.TensorProto.INT8): np.dtype("int8"),
    int(OnnxData.TensorProto.UINT16): np.dtype("uint16"),
    int(OnnxData.TensorProto.INT16): np.dtype("int16"),
    int(OnnxData.TensorProto.INT32): np.dtype("int32"),
    int(OnnxData.TensorProto.INT64): np.dtype("int64"),
    int(OnnxData.TensorProto.DOUBLE): np.dtype("float64"),
    int(OnnxData.TensorProto.UINT32): np.dtype("uint32"),
    int(OnnxData.TensorProto.UINT64): np.dtype("uint64"),
}
NP_TYPE_TO_TENSOR_TYPE: dict[np.dtype, int] = {v: k for k, v in TENSOR_TYPE_TO_NP_TYPE.items()}


def to_array(tensor: OnnxData.TensorProto) -> np.ndarray:
    """A numpy array (native byte order, read-only view of ``raw_data``) for ``tensor``."""
    np_dtype = TENSOR_TYPE_TO_NP_TYPE.get(int(tensor.data_type))
    if np_dtype is None:
        raise TypeError(f"tensor {tensor.name!r}: unsupported or undefined data_type {tensor.data_type}")
    dims = tuple(tensor.dims)
    arr = np.frombuffer(tensor.raw_data, dtype=np_dtype.newbyteorder("<"))
    if arr.size != int(np.prod(dims, dtype=np.int64)):
        raise ValueError(f"tensor {tensor.name!r}: {arr.size} values do not fill shape {list(dims)}")
    return arr.astype(np_dtype, copy=False).reshape(dims)


def from_array(arr: np.ndarray, name: str) -> OnnxData.TensorProto:
    """A ``TensorProto`` named ``name`` holding ``arr`` (any shape, a supported numeric dtype)."""
    arr = np.asarray(arr)
    dtype = NP_TYPE_TO_TENSOR_TYPE.get(arr.dtype.newbyteorder("="))
    if dtype is None:
        raise TypeError(
            f"tensor {name!r}: numpy dtype {arr.dtype} is not supported by the ONNX processor format"
        )
    tensor = OnnxData.TensorProto()
    tensor.name = name
    tensor.dims.extend(arr.shape)
    tensor.data_type = dtype
    tensor.raw_data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
    return tensor


def convert_endian(tensor: OnnxData.TensorProto) -> None:
    """Swap the byte order of ``raw_data`` in place (for hosts that need it)."""
    np_dtype = TENSOR_TYPE_TO_NP_TYPE[int(tensor.data_type)]
    tensor.raw_data = np.frombuffer(tensor.raw_data, dtype=np_dtype).byteswap().tobytes()


__all__ = [
    "NP_TYPE_TO_TENSOR_TYPE",
    "TENSOR_TYPE_TO_NP_TYPE",
    "OnnxData",
    "convert_endian",
    "from_array",
    "to_array",
]
