"""Small real ONNX models for the KServe client tests, built offline with ``onnx.helper``.

``mixed`` takes the three kinds of tensor a V2 client sends: ``x`` FP32 [-1, 4], ``n`` INT64
[-1, 4] and ``s`` a string (BYTES) [-1, 1]; it answers ``scores = x * scale`` (FP32, fit for
the classification extension), ``count = n + scale`` (INT64) and ``echo = s`` (BYTES). Two
scales make two model versions whose answers differ.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build_mixed(path: Path, scale: int) -> Path:
    nodes = [
        helper.make_node("Mul", ["x", "fscale"], ["scores"]),
        helper.make_node("Add", ["n", "iscale"], ["count"]),
        helper.make_node("Identity", ["s"], ["echo"]),
    ]
    graph = helper.make_graph(
        nodes,
        f"mixed_v{scale}",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("n", TensorProto.INT64, ["N", 4]),
            helper.make_tensor_value_info("s", TensorProto.STRING, ["N", 1]),
        ],
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("count", TensorProto.INT64, ["N", 4]),
            helper.make_tensor_value_info("echo", TensorProto.STRING, ["N", 1]),
        ],
        initializer=[
            numpy_helper.from_array(np.array(scale, dtype=np.float32), "fscale"),
            numpy_helper.from_array(np.array(scale, dtype=np.int64), "iscale"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


__all__ = ["build_mixed"]
