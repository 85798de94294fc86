"""V2 gRPC inference messages (``inference.ModelInferRequest`` / ``ModelInferResponse``) <-> arrays.

Parsing and building only, no I/O. A tensor travels either raw (``raw_input_contents`` /
``raw_output_contents``, read through :mod:`gateway.codecs.v2_tensors` as views over
the received bytes) or typed, in the ``InferTensorContents`` field of its datatype. An
answer mirrors its request: raw outputs for a request with raw inputs (what Triton's
client sends), typed outputs for a request with typed contents (KServe's client with
plain lists), raw whenever an output has no typed field (FP16). Every malformed request
raises :class:`~gateway.codecs.v2_tensors.TensorError` (answered INVALID_ARGUMENT).

An answer's size is known before it is built (its arrays' wire bytes, a typed integer
field's varints counted over the array), and one past the response limit is refused with
:class:`~gateway.core.json_answer.AnswerTooLarge` without building anything. Typed numeric
contents are written as the packed field's wire bytes straight from the array (fixed-width
floats as their memory, integers as varints computed over the whole array) and parsed into
the message by protobuf's C code: no Python object per element.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway._proto import grpc_service_pb2 as pb
from gateway.codecs.v2_tensors import DATATYPES, TensorError, check_shape, datatype_of, from_raw, to_raw
from gateway.core import json_answer

MAX_INPUTS = 1024
# The InferTensorContents field that holds each datatype's elements (FP16 and BF16: none).
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# Per-output parameters a client may send that change nothing here.
_HARMLESS_OUTPUT_PARAMS = frozenset({"binary_data"})


@dataclass(frozen=True)
class InferCall:
    """A parsed ModelInferRequest: the input arrays by name, the requested output names."""

    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]
    typed: bool  # the inputs came as typed contents: answer in kind
    parameters: dict[str, Any] = field(default_factory=dict)  # the request's, as plain values


def parse_infer(req: pb.ModelInferRequest) -> InferCall:
    """The request's tensors, checked: names, datatypes, shapes against the bytes or values sent."""
    n = len(req.inputs)
    if n == 0:
        raise TensorError("a request needs at least one input")
    if n > MAX_INPUTS:
        raise TensorError(f"a request takes at most {MAX_INPUTS} inputs, got {n}")
    raw = req.raw_input_contents
    if raw and len(raw) != n:
        raise TensorError(f"raw_input_contents has {len(raw)} entries for {n} inputs: give one per input")
    inputs: dict[str, np.ndarray] = {}
    for i, t in enumerate(req.inputs):
        if not t.name:
            raise TensorError(f"inputs[{i}]: name must not be empty")
        where = f"input '{t.name}'"
        if t.name in inputs:
            raise TensorError(f"{where}: given twice")
        if raw:
            if t.HasField("contents"):
                raise TensorError(f"{where}: give raw_input_contents or contents, not both")
            inputs[t.name] = from_raw(raw[i], t.datatype, list(t.shape), where)
        else:
            inputs[t.name] = _from_contents(t, where)
    outputs: list[str] = []
    for j, o in enumerate(req.outputs):
        if not o.name:
            raise TensorError(f"outputs[{j}]: name must not be empty")
        if "classification" in o.parameters:
            raise TensorError(f"output '{o.name}': the classification extension is not supported")
        unknown = sorted(set(o.parameters) - _HARMLESS_OUTPUT_PARAMS)
        if unknown:
            raise TensorError(f"output '{o.name}': unsupported parameters {unknown}")
        if o.name in outputs:
            raise TensorError(f"output '{o.name}': requested twice")
        outputs.append(o.name)
    params = {}
    for key, value in req.parameters.items():  # one of bool, int64, string, double, uint64
        which = value.WhichOneof("parameter_choice")
        params[key] = getattr(value, which) if which else None
    return InferCall(inputs, tuple(outputs), typed=not raw, parameters=params)


def _from_contents(t: Any, where: str) -> np.ndarray:
    dims = check_shape(list(t.shape), where)
    dt = DATATYPES.get(t.datatype)
    if dt is None:
        raise TensorError(f"{where}: datatype {t.datatype[:32]!r} is not one of {', '.join(DATATYPES)}")
    field = CONTENTS_FIELD.get(t.datatype)
    if field is None:
        raise TensorError(f"{where}: {t.datatype} has no typed contents; send it in raw_input_contents")
    values = getattr(t.contents, field)
    count = math.prod(dims)
    if len(values) != count:
        raise TensorError(f"{where}: shape {dims} needs {count} values in {field}, got {len(values)}")
    if t.datatype == "BYTES":
        arr = np.empty(count, dtype=object)
        arr[:] = list(values)
        return arr.reshape(dims)
    wide = np.asarray(values, dtype=_WIDE[dt.kind] if dt.kind in _WIDE else dt)
    if wide.dtype != dt:
        # INT8/16 and UINT8/16 travel in 32-bit fields: refuse a value the datatype cannot hold.
        info = np.iinfo(dt)
        if wide.size and (int(wide.min()) < info.min or int(wide.max()) > info.max):
            raise TensorError(f"{where}: a value does not fit {t.datatype}")
        wide = wide.astype(dt)
    return wide.reshape(dims)


# The typed fields of the narrow integer datatypes are 32 bits wide.
_WIDE = {"i": np.dtype("<i8"), "u": np.dtype("<u8")}


# InferTensorContents' field numbers, for writing a packed field's wire bytes.
_FIELD_NUMBER = {name: f.number for name, f in pb.InferTensorContents.DESCRIPTOR.fields_by_name.items()}
# Fields whose elements are written as varints, and the unsigned form each is encoded from
# (a negative int32 is sign-extended to 64 bits on the wire, as protobuf does).
_VARINT_AS = {
    "bool_contents": np.dtype("<u8"),
    "int_contents": np.dtype("<i8"),
    "int64_contents": np.dtype("<i8"),
    "uint_contents": np.dtype("<u8"),
    "uint64_contents": np.dtype("<u8"),
}
_FIXED_AS = {"fp32_contents": np.dtype("<f4"), "fp64_contents": np.dtype("<f8")}
_SHIFTS = np.arange(1, 10, dtype=np.uint64) * np.uint64(7)


def _varint_lengths(u: np.ndarray) -> np.ndarray:
    """Bytes of each element's varint (1 to 10), over the whole array at once."""
    lengths = np.ones(u.shape, dtype=np.intp)
    for shift in _SHIFTS:
        lengths += u >= (np.uint64(1) << shift)
    return lengths


def _varints(u: np.ndarray) -> bytes:
    """The varints of ``u`` (uint64) back to back, built a byte position at a time."""
    lengths = _varint_lengths(u)
    starts = np.cumsum(lengths) - lengths
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    for k in range(10):
        at = lengths > k
        if not at.any():
            break
        low = (u[at] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = np.where(lengths[at] > k + 1, 0x80, 0).astype(np.uint8)
        out[starts[at] + k] = low.astype(np.uint8) | more
    return out.tobytes()


def _unsigned(arr: np.ndarray, field: str) -> np.ndarray:
    flat = arr.reshape(-1)
    if flat.dtype.kind == "b":
        return flat.astype(np.uint64)
    return flat.astype(_VARINT_AS[field], copy=False).view(np.uint64)


def _header(field: str, size: int) -> bytes:
    tag = (_FIELD_NUMBER[field] << 3) | 2  # a length-delimited (packed) field
    return _varints(np.array([tag, size], dtype=np.uint64))


def typed_size(arr: np.ndarray, kind: str) -> int:
    """Bytes of ``arr``'s elements in its typed field, counted before anything is built."""
    field = CONTENTS_FIELD[kind]
    if kind == "BYTES":
        return sum(2 + len(v.encode() if isinstance(v, str) else bytes(v)) for v in arr.reshape(-1).tolist())
    if field in _FIXED_AS:
        return int(arr.size) * _FIXED_AS[field].itemsize
    return int(_varint_lengths(_unsigned(arr, field)).sum())


def _typed_contents(arr: np.ndarray, kind: str) -> bytes:
    """``InferTensorContents`` holding ``arr`` in its numeric field, as wire bytes."""
    field = CONTENTS_FIELD[kind]
    if field in _FIXED_AS:
        payload = np.ascontiguousarray(arr.reshape(-1), dtype=_FIXED_AS[field]).tobytes()
    else:
        payload = _varints(_unsigned(arr, field))
    return _header(field, len(payload)) + payload


def infer_response(
    model_name: str,
    request_id: str,
    arrays: Mapping[str, np.ndarray],
    order: Sequence[str],
    *,
    typed: bool = False,
    version: str = "1",
    limit: int = 0,
) -> pb.ModelInferResponse:
    """The answer holding ``arrays`` in ``order`` (names missing from ``arrays`` are skipped);
    raw unless ``typed`` and every output has a typed field. One whose tensors would pass
    ``limit`` bytes (0: no limit) raises AnswerTooLarge before anything is built."""
    names = [n for n in order if n in arrays]
    kinds = [datatype_of(arrays[n]) for n in names]
    typed = typed and all(k in CONTENTS_FIELD for k in kinds)
    if limit:
        size = sum(
            typed_size(arrays[n], k) if typed else json_answer.raw_size(arrays[n])
            for n, k in zip(names, kinds, strict=True)
        )
        json_answer.check(size, limit, "about" if typed else "")
    resp = pb.ModelInferResponse(model_name=model_name, model_version=version, id=request_id)
    for name, kind in zip(names, kinds, strict=True):
        arr = arrays[name]
        out = resp.outputs.add(name=name, datatype=kind, shape=arr.shape)
        if typed and kind == "BYTES":  # Python objects already: one bytes value each
            out.contents.bytes_contents.extend(
                v.encode() if isinstance(v, str) else bytes(v) for v in arr.reshape(-1)
            )
        elif typed:
            out.contents.MergeFromString(_typed_contents(arr, kind))
        else:
            resp.raw_output_contents.append(bytes(to_raw(arr)))
    return resp


__all__ = ["CONTENTS_FIELD", "MAX_INPUTS", "InferCall", "infer_response", "parse_infer", "typed_size"]
