"""The TF ``PredictRequest``/``PredictResponse`` (root package of tf_predict.proto).

Request: signature_name (1), inputs (2, map name -> ArrayProto), output_filter (3, names).
Response: outputs (1, map name -> ArrayProto).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from .arrays import Tensor, map_entry, named_items, request_array, response_array
from .raw import RawArray, decode_map_entry
from .wire import Field, Pieces, as_buffer, fields, string_field, text


def encode_tf_request(
    signature_name: str | None,
    inputs: Mapping[str, Any],
    output_filter: Sequence[str] = (),
) -> bytes:
    """Serialize a TF ``PredictRequest`` from ndarrays/Tensors (DT inferred from numpy dtype).
    The message is joined at once, so array payloads are written from views, not copies."""
    pieces: Pieces = []
    if signature_name:
        pieces.append(string_field(b"\x0a", signature_name))
    for name, value in inputs.items():
        vp, vs = request_array(value, "tf", f"input {name!r}", copy=False)
        pieces += map_entry(b"\x12", name, vp, vs)[0]
    for out in output_filter:
        pieces.append(string_field(b"\x1a", out))
    return b"".join(pieces)


def encode_tf_response(outputs: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> bytes:
    """Serialize a TF ``PredictResponse`` from a mapping or (name, value) pairs, in order;
    dtypes are chosen so that eas-prediction 0.36 can read them."""
    pieces: Pieces = []
    for name, value in named_items(outputs):
        vp, vs = response_array(value, "tf", f"output {name!r}")
        pieces += map_entry(b"\x0a", name, vp, vs)[0]
    return b"".join(pieces)


def decode_tf_response(buf: Any) -> dict[str, RawArray]:
    """Parse a TF ``PredictResponse`` into ``{name: RawArray}`` (duplicate keys: last wins)."""
    buf = as_buffer(buf)
    outputs: dict[str, RawArray] = {}
    for field, wt, x, y in fields(buf, 0, len(buf)):
        if field == 1 and wt == 2:
            k, v = decode_map_entry(buf, x, y, "tf")
            outputs[k] = v
    return outputs


class TFRequestData(NamedTuple):
    signature_name: str
    inputs: dict[str, Tensor]
    output_filter: list[str]


def decode_tf_request_raw(
    buf: Any, top: Sequence[Field] | None = None
) -> tuple[str, dict[str, RawArray], list[str]]:
    """Parse a TF ``PredictRequest`` without validating tensors. ``top``: its top-level
    fields when already scanned (:func:`~eas_sdk.codecs.eas.wire.scan_fields`)."""
    buf = as_buffer(buf)
    sig = ""
    inputs: dict[str, RawArray] = {}
    filt: list[str] = []
    for field, wt, x, y in fields(buf, 0, len(buf)) if top is None else top:
        if wt != 2:
            continue
        if field == 1:
            sig = text(buf, x, y)
        elif field == 2:
            k, v = decode_map_entry(buf, x, y, "tf")
            inputs[k] = v
        elif field == 3:
            filt.append(text(buf, x, y))
    return sig, inputs, filt


def decode_tf_request(buf: Any) -> TFRequestData:
    """Server side: parse and validate a TF ``PredictRequest`` into shaped Tensors."""
    sig, raw, filt = decode_tf_request_raw(buf)
    return TFRequestData(sig, {k: v.to_tensor(f"input {k!r}") for k, v in raw.items()}, filt)
