"""Cluster Serving's Redis records and results: Arrow IPC streams in base64 (no I/O).

The layout, as bigdl-serving 2.4.0's ``InputQueue`` writes and ``OutputQueue`` reads it
(docs/async-inference.md, "Cluster Serving on Redis"):

* A record is a stream entry ``{"uri": <id>, "data": <base64 of an Arrow IPC stream>}``
  whose one record batch has a column per input:

  - a tensor (``np.ndarray``) or a sparse tensor (``[indices, values, shape]``) is a
    struct column ``{indiceData: list<int32>, indiceShape: list<int32>, data:
    list<float32>, shape: list<int32>}`` of four rows, row *k* holding only field *k*:
    a dense tensor has empty ``indiceData``/``indiceShape``, ``data`` (float32, flat) and
    ``shape``; a sparse one has its indices flattened from ``[ndim, nnz]`` in
    ``indiceData``, that shape in ``indiceShape``, the values in ``data`` and the dense
    shape in ``shape``;
  - a string column of one row is an image (base64 of a JPEG/PNG/... file, from a path or
    ``{"b64": ...}``) or a list of strings joined with ``|``.

* A result is the hash ``cluster-serving_<stream>:<uri>`` whose field ``value`` is
  base64 of an Arrow IPC stream with one record batch per output, each of two columns of
  equal length: the output's values (flat) and its shape padded with nulls (the client
  drops the nulls and reshapes); or the text ``NaN`` when the record could not be served.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from eas_sdk._core.cluster_serving import (
    ClusterServingInputError,
    ImageTooLarge,
    b64_image_bytes,
    decode_image,
    sparse_to_coo,
    top_of,
)
from gateway.codecs.cluster_serving import DEFAULT_MAX_IMAGE_PIXELS, ClusterServingRequestError

RESULT_PREFIX = "cluster-serving_"
FAILED = "NaN"  # what OutputQueue.query returns as is for a record that was not served
_TENSOR_FIELDS = ("indiceData", "indiceShape", "data", "shape")


def result_key(stream: str, uri: str) -> str:
    return f"{RESULT_PREFIX}{stream}:{uri}"


def _list_row(col: pa.StructArray, field: str, row: int) -> np.ndarray | None:
    value = col.field(field)[row]
    if not value.is_valid:
        return None
    return value.values.to_numpy(zero_copy_only=False)


def _tensor(col: pa.StructArray, where: str) -> tuple[str, Any]:
    if len(col) != 4:
        raise ClusterServingRequestError(f"{where}: a tensor column has 4 rows, got {len(col)}")
    indices = _list_row(col, "indiceData", 0)
    data = _list_row(col, "data", 2)
    shape = _list_row(col, "shape", 3)
    if data is None or shape is None:
        raise ClusterServingRequestError(f"{where}: tensor without data or shape")
    if indices is not None and indices.size:
        ishape = _list_row(col, "indiceShape", 1)
        if ishape is None:
            raise ClusterServingRequestError(f"{where}: sparse tensor without indiceShape")
        try:
            idx = indices.astype(np.int64).reshape([int(d) for d in ishape])
            return "sparse", sparse_to_coo(idx, data, shape, where, points_first=False)
        except ValueError as exc:  # ClusterServingInputError included
            raise ClusterServingRequestError(f"{where}: bad sparse tensor ({exc})") from None
    try:
        # float32 on the wire; sent without a dtype so the processor casts to the model's.
        return "dense", data.astype(np.float32).reshape([int(d) for d in shape])
    except ValueError as exc:
        raise ClusterServingRequestError(
            f"{where}: data does not fit shape {shape.tolist()} ({exc})"
        ) from None


def _text(col: pa.Array, where: str) -> tuple[str, Any]:
    if len(col) != 1 or not col[0].is_valid:
        raise ClusterServingRequestError(f"{where}: a string column has one value")
    value = str(col[0].as_py())
    raw = b64_image_bytes(value)
    try:
        if raw is not None:
            # The pixels its header declares are checked before it is decoded (413 beyond).
            return "dense", decode_image(raw, where, max_pixels=DEFAULT_MAX_IMAGE_PIXELS)
    except ImageTooLarge as exc:
        raise ClusterServingRequestError(str(exc), 413) from None
    except ClusterServingInputError as exc:
        raise ClusterServingRequestError(str(exc)) from None
    # Python strings, never numpy's fixed-width unicode (which pads each to the longest).
    words = value.split("|")
    arr = np.empty(len(words), dtype=object)
    arr[:] = words
    return "dense", arr


def decode_record(fields: Mapping[bytes, bytes]) -> tuple[str, dict[str, tuple[str, Any]]]:
    """A stream entry -> (uri, {input name: classified value}) for ``batch_instances``.
    Raises ClusterServingRequestError naming what is wrong."""
    uri_raw = fields.get(b"uri")
    if uri_raw is None:
        raise ClusterServingRequestError("the record has no uri")
    uri = uri_raw.decode("utf-8", "replace")
    data = fields.get(b"data")
    if data is None:
        raise ClusterServingRequestError(f"{uri}: the record has no data")
    try:
        raw = base64.b64decode(data, validate=True)
        batch = pa.ipc.open_stream(raw).read_next_batch()
    except (binascii.Error, ValueError, pa.ArrowException, StopIteration) as exc:
        raise ClusterServingRequestError(f"{uri}: data is not base64 of an Arrow stream ({exc})") from None
    inputs: dict[str, tuple[str, Any]] = {}
    for field, col in zip(batch.schema, batch.columns, strict=True):
        where = f"{uri}.{field.name}"
        if pa.types.is_struct(field.type) and {f.name for f in field.type} >= set(_TENSOR_FIELDS):
            inputs[field.name] = _tensor(col, where)
        elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            inputs[field.name] = _text(col, where)
        else:
            raise ClusterServingRequestError(f"{where}: unsupported column type {field.type}")
    if not inputs:
        raise ClusterServingRequestError(f"{uri}: the record has no inputs")
    return uri, inputs


def _output_batch(arr: np.ndarray) -> pa.RecordBatch:
    if arr.dtype.kind in ("U", "S", "O"):
        raise ValueError(f"a {arr.dtype} output cannot be returned to OutputQueue (numbers only)")
    if arr.dtype.kind == "b":
        arr = arr.astype(np.uint8)
    shape = list(arr.shape)
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.size == 0:
        raise ValueError("an empty output cannot be returned to OutputQueue")
    # Both columns have one length; the shape is padded with nulls (dropped by the client).
    # An output smaller than its rank loses size-1 dimensions, which the values do not need.
    while len(shape) > flat.size and 1 in shape:
        shape.remove(1)
    shape_col = pa.array(shape + [None] * (flat.size - len(shape)), type=pa.int32())
    return pa.RecordBatch.from_arrays([pa.array(flat), shape_col], names=["data", "shape"])


def encode_result(outputs: Mapping[str, np.ndarray]) -> str:
    """One instance's outputs (in the model's order) -> the hash's ``value``: one record
    batch per output, so the client returns an ndarray (a list of them for several)."""
    batches = [_output_batch(np.asarray(arr)) for arr in outputs.values()]
    if not batches:
        raise ValueError("the model returned no output")
    sink = pa.BufferOutputStream()
    # The client reads every batch with one reader: one schema for all of them is required,
    # so outputs of different dtypes are sent as float32, as Cluster Serving's models return.
    if len({b.schema for b in batches}) > 1:
        batches = [
            pa.RecordBatch.from_arrays([b.column(0).cast(pa.float32()), b.column(1)], names=["data", "shape"])
            for b in batches
        ]
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode("ascii")


def top_n_result(outputs: Mapping[str, np.ndarray], n: int, output: str = "") -> dict[str, np.ndarray]:
    """One instance's top-N answer as Cluster Serving's ``topN`` writes it: its ``n`` most
    probable classes as ``[[class, probability], ...]`` (float32, most probable first), the one
    tensor the client reads back. ValueError when the outputs hold no such vector."""
    top = top_of(dict(outputs), n, output or None)
    pairs = np.array([[float(k), v] for k, v in top.items()], dtype=np.float32).reshape(-1, 2)
    return {output or next(iter(outputs)): pairs}


__all__ = ["FAILED", "RESULT_PREFIX", "decode_record", "encode_result", "result_key", "top_n_result"]
