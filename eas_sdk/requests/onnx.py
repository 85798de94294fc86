"""OnnxRequest / OnnxResponse: the HIE ONNX processor's ``DataProto`` format.

Same API as ``eas_prediction.OnnxRequest``: ``add_tensor(TensorProto)`` (build tensors with
``eas_sdk.OnnxDataHelper.from_array``), and responses expose ``get_size``, ``get_name`` and
``get_tensor``. Added: ``add_array(name, ndarray)`` and ``OnnxResponse.to_numpy(index_or_name)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._proto import onnx_data_pb2 as OnnxData
from ..onnx_data_helper import from_array, to_array


class OnnxRequest:
    def __init__(self) -> None:
        self.request_data = OnnxData.DataProto()
        self.name_index_map: dict[str, int] = {}

    def __str__(self) -> str:
        return str(self.request_data)

    def add_tensor(self, tensor: OnnxData.TensorProto) -> int:
        """Add (or replace, by name) an input tensor; returns its position in the request."""
        if not isinstance(tensor, OnnxData.TensorProto):
            raise TypeError(f"add_tensor expects an OnnxData.TensorProto, got {type(tensor).__name__}")
        index = self.name_index_map.get(tensor.name)
        if index is None:
            index = len(self.request_data.tensors)
            self.name_index_map[tensor.name] = index
            self.request_data.tensors.add()
        self.request_data.tensors[index].CopyFrom(tensor)
        return index

    def add_array(self, name: str, array: Any) -> int:
        """Add a numpy array (any shape, numeric dtype) as input ``name``."""
        return self.add_tensor(from_array(np.asarray(array), name))

    def to_string(self) -> bytes:
        return self.request_data.SerializeToString()

    def parse_response(self, response_data: bytes) -> OnnxResponse:
        return OnnxResponse(response_data)


class OnnxResponse:
    def __init__(self, response_data: bytes | None = None) -> None:
        self.response = OnnxData.DataProto()
        if response_data:
            self.response.ParseFromString(response_data)

    def __str__(self) -> str:
        return str(self.response)

    def get_size(self) -> int:
        return len(self.response.tensors)

    def get_name(self, output_index: int) -> str:
        return self.response.tensors[output_index].name

    def get_tensor(self, output_index: int) -> OnnxData.TensorProto:
        return self.response.tensors[output_index]

    def to_numpy(self, output: int | str) -> np.ndarray:
        """The output at a position or with a name, as a shaped numpy array."""
        if isinstance(output, str):
            for tensor in self.response.tensors:
                if tensor.name == output:
                    return to_array(tensor)
            raise KeyError(f"no output named {output!r}")
        return to_array(self.response.tensors[output])
