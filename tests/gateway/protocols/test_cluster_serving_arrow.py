"""Cluster Serving's Arrow records and results: what is refused and how results are shaped.
(The real bigdl-serving client against a gateway: tests/e2e/test_cluster_serving_redis_e2e.py.)"""

from __future__ import annotations

import base64

import numpy as np
import pyarrow as pa
import pytest

from gateway.codecs.cluster_serving import ClusterServingRequestError
from gateway.codecs.cluster_serving_arrow import decode_record, encode_result, result_key

_TENSOR = pa.struct(
    [
        pa.field("indiceData", pa.list_(pa.int32())),
        pa.field("indiceShape", pa.list_(pa.int32())),
        pa.field("data", pa.list_(pa.float32())),
        pa.field("shape", pa.list_(pa.int32())),
    ]
)


def _record(columns: dict[str, pa.Array], uri: str = "u1") -> dict[bytes, bytes]:
    batch = pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return {b"uri": uri.encode(), b"data": base64.b64encode(sink.getvalue().to_pybytes())}


def _tensor(data: list[float], shape: list[int]) -> pa.Array:
    rows = [{"indiceData": []}, {"indiceShape": []}, {"data": data}, {"shape": shape}]
    return pa.array(rows, type=_TENSOR)


def _read(value: str) -> list[np.ndarray]:
    reader = pa.ipc.open_stream(base64.b64decode(value))
    out = []
    for b in reader:  # as OutputQueue.get_ndarray_from_record_batch does
        shape = [i for i in b[1].to_pylist() if i]
        out.append(b[0].to_numpy().reshape(shape))
    return out


def test_dense_tensor_and_strings() -> None:
    uri, inst = decode_record(_record({"t": _tensor([1, 2, 3, 4, 5, 6], [2, 3])}))
    kind, arr = inst["t"]
    assert (uri, kind, arr.shape, arr.dtype) == ("u1", "dense", (2, 3), np.float32)
    _, inst = decode_record(_record({"w": pa.array(["a|b|c"])}))
    assert inst["w"][1].tolist() == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({b"data": b"x"}, "no uri"),
        ({b"uri": b"u"}, "u: the record has no data"),
        ({b"uri": b"u", b"data": b"%%%"}, "not base64 of an Arrow stream"),
        (_record({"t": _tensor([1, 2, 3], [2, 2])}), "u1.t: data does not fit shape [2, 2]"),
        (_record({"t": pa.array([1, 2])}), "u1.t: unsupported column type int64"),
        (_record({"w": pa.array(["a", "b"])}), "u1.w: a string column has one value"),
    ],
)
def test_bad_records_name_what_is_wrong(fields: dict[bytes, bytes], message: str) -> None:
    with pytest.raises(ClusterServingRequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_record(fields)


def test_results_read_back_as_the_client_reads_them() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    [got] = _read(encode_result({"y": x}))
    np.testing.assert_array_equal(got, x)
    # Several outputs of different dtypes: one schema for the stream, values as float32.
    a, b = _read(encode_result({"ids": np.array([1, 2, 3]), "p": np.array([[0.5]], dtype=np.float32)}))
    np.testing.assert_array_equal(a, [1.0, 2.0, 3.0])
    assert b.size == 1 and b.reshape(-1)[0] == 0.5  # smaller than its rank: size-1 dims dropped
    assert result_key("serving_stream", "u1") == "cluster-serving_serving_stream:u1"


@pytest.mark.parametrize("bad", [np.array(["x"]), np.zeros((0, 2), dtype=np.float32)])
def test_outputs_the_client_cannot_read_are_refused(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="OutputQueue"):
        encode_result({"y": bad})
