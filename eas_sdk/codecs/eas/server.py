"""A server's side of an EAS predict call: resolve the body's format, decode it into a
:class:`DecodedRequest`, and encode the model's outputs in the request's own format.

TF and Torch bodies are decoded by this package's zero-copy decoders, Blade bodies by the
generated messages (protobuf's C parser is faster on the small bodies Blade callers send,
and as fast on large ones). Every problem with a body raises :class:`InvalidInput`
(HTTP 400) with a message that names the input; nothing large is allocated before the
counts are checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..._proto import blade_pb2
from .blade import BladeInput, encode_blade_response
from .decoded import (
    CONTENT_TYPE_JSON,
    CONTENT_TYPE_PROTOBUF,
    FORMATS,
    MAX_INPUTS,
    DecodedRequest,
    InputTensor,
    InvalidInput,
    count_elements,
)
from .dtypes import BLADE_NUMPY_DTYPES
from .json_form import decode_json, encode_json_response
from .raw import RawArray
from .sniff import classify, sniff
from .tf import decode_tf_request_raw, encode_tf_response
from .torch import decode_torch_request_raw, encode_torch_response, is_placeholder
from .wire import CodecError, Field, scan_fields, snappy_decompress

# The largest body a snappy-compressed request may inflate to.
MAX_SNAPPY_SIZE = 64 * 1024 * 1024


def _snappy_decompress(body: bytes) -> bytes | None:
    try:
        return snappy_decompress(body, MAX_SNAPPY_SIZE)
    except (CodecError, ImportError):  # not snappy, or cramjam (the gateway extra) missing
        return None


def resolve_format(body: bytes, configured: str = "auto", header: str | None = None) -> str:
    """The request format: the header, else the service setting, else sniffed from the body."""
    fmt = (header or "").strip().lower() or configured
    if fmt not in FORMATS and fmt != "auto":
        raise InvalidInput(
            f"unknown request format {fmt[:32]!r}; expected one of: auto, {', '.join(FORMATS)}"
        )
    if fmt != "auto":
        return fmt
    head = body[:64].lstrip()
    if head.startswith(b"{"):
        return "json"
    kind = sniff(body)
    if kind is not None:
        return kind
    return "torch"  # possibly snappy-compressed; decode() tries that and reports failure


_DECODE_ERRORS = (CodecError, ValueError, TypeError, IndexError, OverflowError)


def _raw_array(r: RawArray, where: str) -> InputTensor | None:
    """A decoded TF/Torch ArrayProto (eas_sdk's zero-copy codec) as a checked Tensor."""
    if is_placeholder(r):
        return None  # a padding entry of TorchRequest.add_feed(index > len)
    if r.dims is not None:
        count_elements(r.dims, where)  # negative dims, absurd sizes: before anything else
    try:
        return InputTensor(r.to_tensor(where).array)
    except CodecError as exc:
        raise InvalidInput(str(exc)) from None
    except _DECODE_ERRORS:
        raise InvalidInput(f"{where}: invalid values") from None


def _decode_tf(body: bytes, top: list[Field] | None = None) -> DecodedRequest:
    try:
        sig, raw, filt = decode_tf_request_raw(body, top)
    except _DECODE_ERRORS:
        raise InvalidInput("cannot decode request as tf") from None
    if len(raw) > MAX_INPUTS:
        raise InvalidInput(f"too many inputs ({len(raw)} > {MAX_INPUTS})")
    req = DecodedRequest("tf", signature=sig, output_names=filt)
    for name, r in raw.items():
        t = _raw_array(r, f"input {name!r}")
        if t is None:
            raise InvalidInput(f"input {name!r}: unsupported dtype DT_INVALID")
        req.named[name] = t
    return req


def _decode_torch(body: bytes, compressed: bool = False, top: list[Field] | None = None) -> DecodedRequest:
    try:
        raw_inputs, raw_map, filt, _debug = decode_torch_request_raw(body, top)
    except _DECODE_ERRORS:
        unpacked = None if compressed else _snappy_decompress(body)
        if unpacked is not None:
            return _decode_torch(unpacked, compressed=True)
        raise InvalidInput("cannot decode request as torch") from None
    if len(raw_inputs) + len(raw_map) > MAX_INPUTS:
        raise InvalidInput(f"too many inputs (> {MAX_INPUTS})")
    req = DecodedRequest("torch", output_indices=[int(i) for i in filt], compressed=compressed)
    for i, r in enumerate(raw_inputs):
        req.positional.append(_raw_array(r, f"input {i}"))
    for name, r in raw_map.items():
        t = _raw_array(r, f"input {name!r}")
        if t is not None:
            req.named[name] = t
    req.by_map = bool(raw_map) and not raw_inputs
    return req


_BLADE_FIELDS: tuple[tuple[str, Any], ...] = (
    ("float_val", np.float32),
    ("int_val", np.int32),
    ("int64_val", np.int64),
    ("string_val", object),
)


def _decode_blade(body: bytes) -> DecodedRequest:
    msg = blade_pb2.Request()
    try:
        msg.ParseFromString(body)
    except Exception:
        raise InvalidInput("cannot decode request as blade") from None
    if len(msg.inputs) > MAX_INPUTS:
        raise InvalidInput(f"too many inputs ({len(msg.inputs)} > {MAX_INPUTS})")
    req = DecodedRequest("blade", signature=msg.tf_signature_name)
    for a in msg.inputs:
        name = (a.name_in_dl_model or a.blade_blob_name).strip()
        where = f"input {name!r}"
        dims = list(a.shape.dim)
        # Blade arrays carry no dtype: the populated value field tells it.
        values, dt = a.float_val, np.float32
        for fname, cand in _BLADE_FIELDS:
            if len(getattr(a, fname)):
                values, dt = getattr(a, fname), cand
                break
        nvals = len(values)
        if not dims and nvals != 1:
            dims = [nvals]
        n = count_elements(dims, where)
        if n != nvals:
            raise InvalidInput(f"{where}: shape {dims} needs {n} values, got {nvals}")
        if dt is object:
            arr = np.empty(nvals, dtype=object)
            arr[:] = list(values)
        else:
            arr = np.asarray(values, dtype=dt)
        req.named[name] = InputTensor(arr.reshape(dims), loose=True)
    for info in msg.output_info:
        name = (info.name_in_dl_model or info.blade_blob_name).strip()
        req.output_names.append(name)
        req.output_types[name] = info.data_type
    return req


def decode(body: bytes, fmt: str, top: list[Field] | None = None) -> DecodedRequest:
    """Decode ``body`` as ``fmt`` (a resolved format, see :func:`resolve_format`). ``top``:
    the body's top-level fields when the caller has scanned them already (to sniff)."""
    if fmt == "tf":
        return _decode_tf(body, top)
    if fmt == "torch":
        return _decode_torch(body, top=top)
    if fmt == "blade":
        return _decode_blade(body)
    if fmt == "json":
        return decode_json(body)
    raise InvalidInput(f"unknown request format {fmt!r}")


def decode_request(body: bytes, configured: str = "auto", header: str | None = None) -> DecodedRequest:
    """Resolve the format (header > service setting > sniffing) and decode ``body``."""
    fmt = (header or "").strip().lower() or configured
    if fmt != "auto":
        if fmt not in FORMATS:
            raise InvalidInput(
                f"unknown request format {fmt[:32]!r}; expected one of: auto, {', '.join(FORMATS)}"
            )
        return decode(body, fmt)
    if body[:64].lstrip().startswith(b"{"):
        return decode_json(body)
    # One scan of the top-level fields, for the sniffing and the decoding.
    top = scan_fields(body)
    kind = classify(body, top)
    if kind is not None:
        try:
            return decode(body, kind, top)
        except InvalidInput as exc:
            first: InvalidInput | None = exc
    else:
        first = None
    # Not (usable) protobuf: only a snappy-compressed Torch request is left.
    raw = _snappy_decompress(body)
    if raw is not None and sniff(raw) == "torch":
        return _decode_torch(raw, compressed=True)
    if first is not None:
        raise first
    raise InvalidInput("cannot decode request as tf, torch, blade or json")


def _wire_ready(value: Any) -> np.ndarray:
    # protobuf's int64 fields carry uint64 outputs as their bits, as a server has always sent them.
    arr = np.asarray(value)
    dt = arr.dtype
    return arr.view(np.int64) if dt.kind == "u" and dt.itemsize == 8 else arr


def blade_outputs(outputs: Sequence[tuple[str, np.ndarray]], types: Mapping[str, int]) -> list[BladeInput]:
    """Blade answers: each output cast to the data type its output_info asked for (none
    asked: as the model gives it), with batchsize its first dimension."""
    items = []
    for name, value in outputs:
        arr = _wire_ready(value)
        want = BLADE_NUMPY_DTYPES.get(types.get(name, 0))
        if want is not None and want.kind == "O":
            arr = arr.astype(object) if arr.dtype.kind not in "OUS" else arr
        elif want is not None and arr.dtype.kind not in "OUS":
            arr = arr.astype(want)
        items.append(BladeInput(name, arr, int(arr.shape[0]) if arr.ndim else 1))
    return items


def encode_response(
    req: DecodedRequest, names: Sequence[str], arrays: Sequence[np.ndarray], indices: Sequence[int]
) -> tuple[bytes, str]:
    """Encode the selected outputs in the request's own format; returns (body, content type).

    An output the format cannot carry (a complex dtype, say) raises InvalidInput.
    """
    kind = req.kind
    try:
        if kind == "tf":
            body = encode_tf_response([(names[i], _wire_ready(arrays[i])) for i in indices])
            return body, CONTENT_TYPE_PROTOBUF
        sel = [(names[i], arrays[i]) for i in indices]
        if kind == "torch":
            if req.by_map:
                return encode_torch_response((), [(n, _wire_ready(a)) for n, a in sel]), CONTENT_TYPE_PROTOBUF
            return encode_torch_response([_wire_ready(a) for _, a in sel]), CONTENT_TYPE_PROTOBUF
        if kind == "blade":
            return encode_blade_response(blade_outputs(sel, req.output_types)), CONTENT_TYPE_PROTOBUF
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"cannot encode the outputs: {exc}") from None
    return encode_json_response(sel), CONTENT_TYPE_JSON
