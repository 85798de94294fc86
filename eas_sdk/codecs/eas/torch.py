"""The PyTorch ``PredictRequest``/``PredictResponse`` (package ``pytorch.eas``).

Request: inputs (1, repeated ArrayProto, by position), output_filter (2, packed int32
indices), map_inputs (3, map name -> ArrayProto), debug_level (100). The whole body may be
raw-snappy compressed (``TorchRequest(flag=True)``); nothing on the wire says so.
Response: outputs (1, repeated ArrayProto), map_outputs (2, map name -> ArrayProto).
Torch's ArrayProto has no bool field: bools travel as int_val 0/1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from .arrays import Tensor, map_entry, named_items, request_array, response_array
from .dtypes import DT_INVALID, Kind
from .raw import RawArray, decode_array_proto, decode_map_entry, numeric_piece
from .values import to_wire_values
from .wire import (
    CodecError,
    Field,
    Pieces,
    as_buffer,
    encode_varints,
    fields,
    int32,
    len_field,
    snappy_decompress,
    varint,
)


def encode_torch_request(
    inputs: Sequence[Any],
    map_inputs: Mapping[str, Any] | None = None,
    output_filter: Sequence[int] = (),
    debug_level: int = 0,
) -> bytes:
    """Serialize a Torch ``PredictRequest``; a None input is written as an empty ArrayProto."""
    pieces: Pieces = []
    for i, value in enumerate(inputs):
        if value is None:
            pieces.append(b"\x0a\x00")
            continue
        vp, vs = request_array(value, "torch", f"input {i}")
        pieces += len_field(b"\x0a", vp, vs)[0]
    if output_filter:
        payload = encode_varints(to_wire_values(list(output_filter), Kind.INT32, "output_filter"))
        pieces += [b"\x12", varint(len(payload)), payload]
    for name, value in (map_inputs or {}).items():
        vp, vs = request_array(value, "torch", f"map input {name!r}")
        pieces += map_entry(b"\x1a", name, vp, vs)[0]
    if debug_level:
        pieces.append(b"\xa0\x06" + varint(int(debug_level)))
    return b"".join(pieces)


def encode_torch_response(
    outputs: Iterable[Any], map_outputs: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None
) -> bytes:
    """Serialize a Torch ``PredictResponse``: positional outputs, then map_outputs (a mapping
    or (name, value) pairs); dtypes are chosen so that eas-prediction 0.36 can read them."""
    pieces: Pieces = []
    for i, value in enumerate(outputs):
        vp, vs = response_array(value, "torch", f"output {i}")
        pieces += len_field(b"\x0a", vp, vs)[0]
    for name, value in named_items(map_outputs or ()):
        vp, vs = response_array(value, "torch", f"map output {name!r}")
        pieces += map_entry(b"\x12", name, vp, vs)[0]
    return b"".join(pieces)


def decode_torch_response(buf: Any) -> tuple[list[RawArray], dict[str, RawArray]]:
    """Parse a Torch ``PredictResponse`` into (positional outputs, map outputs)."""
    buf = as_buffer(buf)
    outputs: list[RawArray] = []
    map_outputs: dict[str, RawArray] = {}
    for field, wt, x, y in fields(buf, 0, len(buf)):
        if wt != 2:
            continue
        if field == 1:
            outputs.append(decode_array_proto(buf, x, y, "torch"))
        elif field == 2:
            k, v = decode_map_entry(buf, x, y, "torch")
            map_outputs[k] = v
    return outputs, map_outputs


class TorchRequestData(NamedTuple):
    inputs: list[Tensor | None]
    map_inputs: dict[str, Tensor]
    output_filter: list[int]
    debug_level: int


def decode_torch_request_raw(
    buf: Any, top: Sequence[Field] | None = None
) -> tuple[list[RawArray], dict[str, RawArray], list[int], int]:
    """Parse an (uncompressed) Torch ``PredictRequest`` without validating tensors. ``top``:
    its top-level fields when already scanned (:func:`~eas_sdk.codecs.eas.wire.scan_fields`)."""
    buf = as_buffer(buf)
    inputs: list[RawArray] = []
    map_inputs: dict[str, RawArray] = {}
    filt: list[int] = []
    debug = 0
    for field, wt, x, y in fields(buf, 0, len(buf)) if top is None else top:
        if field == 1 and wt == 2:
            inputs.append(decode_array_proto(buf, x, y, "torch"))
        elif field == 2:
            filt += numeric_piece(buf, Kind.INT32, wt, x, y).tolist()
        elif field == 3 and wt == 2:
            k, v = decode_map_entry(buf, x, y, "torch")
            map_inputs[k] = v
        elif field == 100 and wt == 0:
            debug = int32(x)
    return inputs, map_inputs, filt, debug


def is_placeholder(raw: RawArray) -> bool:
    """An empty ArrayProto: the padding ``TorchRequest.add_feed(index > len)`` writes."""
    return raw.dtype == DT_INVALID and raw.dims is None and not raw.kinds()


def decode_torch_request(buf: Any, compressed: bool | None = False) -> TorchRequestData:
    """Server side: parse and validate a Torch ``PredictRequest``.

    ``compressed=True`` snappy-decompresses first (TorchRequest(flag=True) bodies; nothing on
    the wire says so). ``None`` sniffs: a body that snappy-decompresses and then parses is
    taken as compressed, anything else as plain. Sniffing is a heuristic (a short plain
    body can also be valid snappy), so a server should prefer explicit configuration.
    Placeholder inputs (empty ArrayProto with DT_INVALID) come back as None.
    """
    if compressed is None:
        try:
            return _decode_torch_plain(snappy_decompress(buf))
        except CodecError:
            return _decode_torch_plain(buf)
    return _decode_torch_plain(snappy_decompress(buf) if compressed else buf)


def _decode_torch_plain(buf: Any) -> TorchRequestData:
    raw_inputs, raw_map, filt, debug = decode_torch_request_raw(buf)
    inputs = [None if is_placeholder(r) else r.to_tensor(f"input #{i}") for i, r in enumerate(raw_inputs)]
    map_inputs = {k: v.to_tensor(f"map input {k!r}") for k, v in raw_map.items()}
    return TorchRequestData(inputs, map_inputs, filt, debug)
