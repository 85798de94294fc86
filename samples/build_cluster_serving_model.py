"""Build ``cluster_serving.onnx``: one small model using every Cluster Serving input kind.

Inputs (N is the batch axis; an ``enqueue`` is a batch of one):

* ``words``          string[N,K]   a list of strings
* ``image``          uint8[N,H,W,3] an image (decoded to RGB by the client or the gateway)
* ``tensor``         float32[N,2]  a dense tensor
* ``sparse.indices`` int64[nnz,3], ``sparse.values`` float32[nnz], ``sparse.shape`` int64[3]:
  a sparse tensor of shape [N,5,10] in COO form (how the gateway passes sparse tensors)

Outputs:

* ``word_ids``   int64[N,K]   = the vocabulary id of each word (``VOCAB``, unknown -> 0)
* ``image_mean`` float32[N,3] = the mean of each colour channel
* ``tensor_x2``  float32[N,2] = tensor * 2
* ``sparse_dense`` float32[N,5,10] = the sparse tensor densified with ScatterND

Usage: ``python samples/build_cluster_serving_model.py [out_dir]`` (default ``samples/models``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

DEFAULT_DIR = Path(__file__).resolve().parent / "models"
VOCAB = {"hello": 1, "world": 2, "come": 3, "on": 4, "united": 5}
SPARSE_SHAPE = (5, 10)


def build_model() -> bytes:
    from onnx import TensorProto, helper

    f32, i64, u8, s = TensorProto.FLOAT, TensorProto.INT64, TensorProto.UINT8, TensorProto.STRING
    inputs = [
        helper.make_tensor_value_info("words", s, ["N", "K"]),
        helper.make_tensor_value_info("image", u8, ["N", "H", "W", 3]),
        helper.make_tensor_value_info("tensor", f32, ["N", 2]),
        helper.make_tensor_value_info("sparse.indices", i64, ["nnz", 3]),
        helper.make_tensor_value_info("sparse.values", f32, ["nnz"]),
        helper.make_tensor_value_info("sparse.shape", i64, [3]),
    ]
    outputs = [
        helper.make_tensor_value_info("word_ids", i64, ["N", "K"]),
        helper.make_tensor_value_info("image_mean", f32, ["N", 3]),
        helper.make_tensor_value_info("tensor_x2", f32, ["N", 2]),
        helper.make_tensor_value_info("sparse_dense", f32, ["N", *SPARSE_SHAPE]),
    ]
    keys = list(VOCAB)
    nodes = [
        helper.make_node(
            "LabelEncoder",
            ["words"],
            ["word_ids"],
            domain="ai.onnx.ml",
            keys_strings=keys,
            values_int64s=[VOCAB[k] for k in keys],
            default_int64=0,
        ),
        helper.make_node("Cast", ["image"], ["image_f"], to=f32),
        helper.make_node("ReduceMean", ["image_f", "hw_axes"], ["image_mean"], keepdims=0),
        helper.make_node("Mul", ["tensor", "two"], ["tensor_x2"]),
        helper.make_node(
            "ConstantOfShape",
            ["sparse.shape"],
            ["zeros"],
            value=helper.make_tensor("zero", f32, [1], [0.0]),
        ),
        helper.make_node("ScatterND", ["zeros", "sparse.indices", "sparse.values"], ["sparse_dense"]),
    ]
    inits = [
        helper.make_tensor("hw_axes", i64, [2], [1, 2]),
        helper.make_tensor("two", f32, [], [2.0]),
    ]
    graph = helper.make_graph(nodes, "cluster_serving", inputs, outputs, inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.onnx.ml", 2)],
        producer_name="easkit-samples",
    )
    model.ir_version = 8
    return bytes(model.SerializeToString())


def reference(
    words: np.ndarray, image: np.ndarray, tensor: np.ndarray, coo: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> dict[str, np.ndarray]:
    """What the model computes, in numpy (for tests)."""
    ids = np.vectorize(lambda w: VOCAB.get(str(w), 0), otypes=[np.int64])(words)
    dense = np.zeros(tuple(int(d) for d in coo[2]), dtype=np.float32)
    dense[tuple(coo[0].T)] = coo[1]
    return {
        "word_ids": ids,
        "image_mean": image.astype(np.float32).mean(axis=(1, 2)),
        "tensor_x2": tensor.astype(np.float32) * 2,
        "sparse_dense": dense,
    }


def build(out_dir: str | Path | None = None) -> Path:
    out = Path(out_dir) if out_dir else DEFAULT_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cluster_serving.onnx"
    data = build_model()
    if not path.exists() or path.read_bytes() != data:
        tmp = path.with_suffix(".onnx.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else None))
