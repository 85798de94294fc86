"""Server side of the EAS predict protobuf family (TF, Torch, Blade) and the JSON form.

The one place that parses, validates and encodes predict bodies for built-in
processors. TF and Torch bodies are decoded by eas_sdk's codec (zero-copy numpy
views of packed fields), Blade by the generated messages; responses are written
straight from numpy memory for float/double/bool values (the hot path: a large
tensor is copied once) and through the generated messages for everything else.

Request formats (see docs/processors.md):

* ``tf``    ``PredictRequest`` (root package): inputs by name, ``output_filter`` by name.
* ``torch`` ``pytorch.eas.PredictRequest``: inputs by position (or ``map_inputs`` by name),
  ``output_filter`` by index; the body may be raw-snappy compressed (``TorchRequest(flag=True)``).
* ``blade`` ``blade.Request``: inputs by ``name_in_dl_model``; ``output_info`` selects outputs.
* ``json``  ``{"inputs": {name: nested list | {"shape", "dtype", "data"}}, "outputs": [...]}``.

Every problem with a body raises :class:`InvalidInput` (HTTP 400) with a message
that names the input; nothing large is allocated before the counts are checked.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eas_sdk._core import tensor as _codec
from eas_sdk._proto import blade_pb2, tf_predict_pb2

try:  # orjson is part of the gateway extra; the stdlib is the fallback
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only without the extra
    _orjson = None

FORMATS = ("tf", "torch", "blade", "json")
# Largest tensor a request may declare (elements), checked before any allocation.
MAX_ELEMENTS = 1 << 28
MAX_INPUTS = 1024
CONTENT_TYPE_PROTOBUF = "application/octet-stream"
CONTENT_TYPE_JSON = "application/json"


class InvalidInput(ValueError):
    """The request body cannot be used; answered as HTTP 400 with ``message``."""

    status = 400
    code = "InvalidInput"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# --- dtype tables ------------------------------------------------------------------

_TF = tf_predict_pb2

_JSON_DTYPES = {
    "float32": np.float32, "float": np.float32, "float64": np.float64, "double": np.float64,
    "float16": np.float16, "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
    "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
    "bool": np.bool_, "string": object, "str": object, "bytes": object,
}  # fmt: skip


def dtype_name(dtype: np.dtype[Any] | None) -> str:
    if dtype is None:
        return "?"
    if dtype == np.dtype(object) or dtype.kind in "USO":
        return "string"
    return dtype.name


def type_str(dtype: np.dtype[Any] | None, shape: Iterable[Any]) -> str:
    dims = ",".join("N" if d is None else str(d) for d in shape)
    return f"{dtype_name(dtype)}[{dims}]"


# --- decoded request -----------------------------------------------------------------


@dataclass
class Tensor:
    """One decoded input. ``loose``: the wire did not state the dtype (Blade, JSON lists),
    so a safe cast to the model's dtype is allowed."""

    array: np.ndarray
    loose: bool = False


@dataclass
class DecodedRequest:
    kind: str
    named: dict[str, Tensor] = field(default_factory=dict)
    positional: list[Tensor | None] = field(default_factory=list)
    # Output selection: names (tf, blade, json, torch map) or indices (torch).
    output_names: list[str] = field(default_factory=list)
    output_indices: list[int] = field(default_factory=list)
    # Blade: requested data type per output name (0: as the model gives it).
    output_types: dict[str, int] = field(default_factory=dict)
    signature: str = ""
    # Torch: inputs came in map_inputs, answer in map_outputs.
    by_map: bool = False
    # Torch: the body was raw-snappy compressed.
    compressed: bool = False


# --- format detection ----------------------------------------------------------------


def _varint(buf: bytes, i: int, n: int) -> tuple[int, int]:
    """Read a varint at ``i``; return (value, next index) or (-1, -1) when malformed."""
    result = 0
    shift = 0
    while i < n:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7
        if shift > 63:
            return -1, -1
    return -1, -1


def scan_fields(buf: bytes, start: int = 0, end: int | None = None) -> list[tuple[int, int, int, int]] | None:
    """Top-level protobuf fields of ``buf[start:end]`` as (number, wire type, start, end).

    For varint fields start/end delimit the varint; for length-delimited ones the payload.
    None when the bytes are not a well-formed message (groups count as malformed).
    """
    n = len(buf) if end is None else end
    i = start
    out: list[tuple[int, int, int, int]] = []
    while i < n:
        key = buf[i]
        if key < 0x80:  # one-byte varints inline (see eas_sdk._core.tensor._fields)
            i += 1
        else:
            key, i = _varint(buf, i, n)
        if key <= 0:
            return None
        fno, wt = key >> 3, key & 7
        if fno == 0:
            return None
        if wt == 0:
            s = i
            _, i = _varint(buf, i, n)
            if i < 0:
                return None
            out.append((fno, 0, s, i))
        elif wt == 2:
            if i < n and (ln := buf[i]) < 0x80:
                i += 1
            else:
                ln, i = _varint(buf, i, n)
            if ln < 0 or i + ln > n:
                return None
            out.append((fno, 2, i, i + ln))
            i += ln
        elif wt == 5:
            if i + 4 > n:
                return None
            out.append((fno, 5, i, i + 4))
            i += 4
        elif wt == 1:
            if i + 8 > n:
                return None
            out.append((fno, 1, i, i + 8))
            i += 8
        else:
            return None
    return out


def _looks_like_array_proto(buf: bytes, s: int, e: int) -> bool:
    """Torch/TF ArrayProto: first key is field 1 varint (dtype); empty is a padded input."""
    if s == e:
        return True
    if buf[s] != 0x08:
        return False
    sub = scan_fields(buf, s, e)
    return sub is not None and all(f <= 8 for f, _, _, _ in sub)


def sniff(body: bytes) -> str | None:
    """Guess the protobuf family of a body that is well-formed wire format.

    Returns "tf", "torch", "blade", or None when the bytes are not protobuf at all.
    """
    fields = scan_fields(body)
    if fields is None:
        return None
    f1 = [f for f in fields if f[0] == 1]
    f2 = [f for f in fields if f[0] == 2]
    if any(f[0] == 100 for f in fields) or any(f[1] == 0 for f in f2):
        return "torch"  # debug_level, or an unpacked output_filter
    if any(f[1] != 2 for f in f1):
        return None
    if len(f1) > 1:
        return "torch"  # repeated positional inputs; TF/Blade carry one signature string
    torchish = bool(f1) and _looks_like_array_proto(body, f1[0][2], f1[0][3])
    sig_is_text = False
    if f1 and not torchish:
        try:
            body[f1[0][2] : f1[0][3]].decode("utf-8")
            sig_is_text = True
        except UnicodeDecodeError:
            return None
    for _, _wt, s, e in f2:
        sub = scan_fields(body, s, e)
        if sub is None:
            continue
        if any(f == 3 and w == 0 for f, w, _, _ in sub):
            return "blade"  # Array.batchsize is required and always sent
        if not torchish and sub and all(f in (1, 2) and w == 2 for f, w, _, _ in sub):
            return "tf"  # map entry {key, value}
    if torchish and f1 and body[f1[0][2] : f1[0][3]] != b"":
        return "torch"
    if sig_is_text or not fields:
        # Inputs absent or unrecognisable; TF and Blade look alike here.
        if any(f[0] == 3 and _blade_output_info(body, f[2], f[3]) for f in fields):
            return "blade"
        return "tf"
    return "torch"


def _blade_output_info(buf: bytes, s: int, e: int) -> bool:
    sub = scan_fields(buf, s, e)
    return bool(sub) and any(f == 3 and w == 0 for f, w, _, _ in sub or ())


def _snappy_decompress(body: bytes) -> bytes | None:
    try:
        import cramjam
    except ImportError:  # pragma: no cover - cramjam is part of the gateway extra
        return None
    # The snappy preamble is the uncompressed length: refuse absurd sizes before inflating.
    length, _ = _varint(body, 0, min(len(body), 10))
    if length < 0 or length > 64 * 1024 * 1024 or length > 64 * max(len(body), 1) + 1024:
        return None
    try:
        return bytes(cramjam.snappy.decompress_raw(body))
    except Exception:
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


# --- decoding ------------------------------------------------------------------------


def _count(dims: Sequence[int], where: str) -> int:
    n = 1
    for d in dims:
        if d < 0:
            raise InvalidInput(f"{where}: negative dimension in shape {list(dims)}")
        n *= d
        if n > MAX_ELEMENTS:
            raise InvalidInput(f"{where}: shape {list(dims)} has more than {MAX_ELEMENTS} elements")
    return n


# Errors the raw decoders may raise on hostile bytes (all mean "not this format").
_DECODE_ERRORS = (_codec.CodecError, ValueError, TypeError, IndexError, OverflowError)


def _raw_array(r: Any, where: str) -> Tensor | None:
    """A decoded TF/Torch ArrayProto (eas_sdk's zero-copy codec) as a checked Tensor."""
    if r.dtype == 0 and r.dims is None and not r.kinds():
        return None  # a padding entry of TorchRequest.add_feed(index > len)
    if r.dims is not None:
        _count(r.dims, where)  # negative dims, absurd sizes: before anything else
    try:
        return Tensor(r.to_tensor(where).array)
    except _codec.CodecError as exc:
        raise InvalidInput(str(exc)) from None
    except _DECODE_ERRORS:
        raise InvalidInput(f"{where}: invalid values") from None


def _decode_tf(body: bytes) -> DecodedRequest:
    try:
        sig, raw, filt = _codec.decode_tf_request_raw(body)
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


def _decode_torch(body: bytes, compressed: bool = False) -> DecodedRequest:
    try:
        raw_inputs, raw_map, filt, _debug = _codec.decode_torch_request_raw(body)
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
        n = _count(dims, where)
        if n != nvals:
            raise InvalidInput(f"{where}: shape {dims} needs {n} values, got {nvals}")
        if dt is object:
            arr = np.empty(nvals, dtype=object)
            arr[:] = list(values)
        else:
            arr = np.asarray(values, dtype=dt)
        req.named[name] = Tensor(arr.reshape(dims), loose=True)
    for info in msg.output_info:
        name = (info.name_in_dl_model or info.blade_blob_name).strip()
        req.output_names.append(name)
        req.output_types[name] = info.data_type
    return req


def _json_loads(body: bytes) -> Any:
    try:
        if _orjson is not None:
            return _orjson.loads(body)
        return json.loads(body)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise InvalidInput("cannot decode request as json") from None


def _json_tensor(name: str, value: Any) -> Tensor:
    where = f"input {name!r}"
    try:
        if isinstance(value, dict):
            data = value.get("data")
            if not isinstance(data, list):
                raise InvalidInput(f"{where}: 'data' must be a flat list")
            dtype_s = value.get("dtype")
            dt: Any = None
            if dtype_s is not None:
                if not isinstance(dtype_s, str) or dtype_s.lower() not in _JSON_DTYPES:
                    raise InvalidInput(f"{where}: unknown dtype {str(dtype_s)[:32]!r}")
                dt = _JSON_DTYPES[dtype_s.lower()]
            shape = value.get("shape")
            if shape is None:
                shape = [len(data)]
            if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in shape
            ):
                raise InvalidInput(f"{where}: 'shape' must be a list of integers")
            n = _count(shape, where)
            if n != len(data):
                raise InvalidInput(f"{where}: shape {shape} needs {n} values, got {len(data)}")
            if dt is object:
                arr = np.empty(len(data), dtype=object)
                arr[:] = [d.encode() if isinstance(d, str) else d for d in data]
            else:
                arr = np.asarray(data, dtype=dt)
                if arr.ndim != 1:
                    raise InvalidInput(f"{where}: 'data' must be a flat list")
            return Tensor(arr.reshape(shape), loose=dt is None)
        if isinstance(value, (list, int, float, bool)):
            arr = np.asarray(value)
            if arr.dtype.kind in "US":
                arr = arr.astype(object)
            elif arr.dtype == np.dtype(object):
                raise InvalidInput(f"{where}: nested lists must be rectangular and of one type")
            return Tensor(arr, loose=True)
    except InvalidInput:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise InvalidInput(f"{where}: {str(exc)[:200]}") from None
    raise InvalidInput(f"{where}: expected a nested list or {{'shape', 'dtype', 'data'}}")


def _decode_json(body: bytes) -> DecodedRequest:
    obj = _json_loads(body)
    if not isinstance(obj, dict) or not isinstance(obj.get("inputs"), dict):
        raise InvalidInput('cannot decode request as json: expected {"inputs": {name: values}}')
    inputs = obj["inputs"]
    if len(inputs) > MAX_INPUTS:
        raise InvalidInput(f"too many inputs ({len(inputs)} > {MAX_INPUTS})")
    outputs = obj.get("outputs") or []
    if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        raise InvalidInput("'outputs' must be a list of output names")
    req = DecodedRequest("json", output_names=list(outputs))
    for name, value in inputs.items():
        req.named[name] = _json_tensor(name, value)
    return req


def decode(body: bytes, fmt: str) -> DecodedRequest:
    """Decode ``body`` as ``fmt`` (a resolved format, see :func:`resolve_format`)."""
    if fmt == "tf":
        return _decode_tf(body)
    if fmt == "torch":
        return _decode_torch(body)
    if fmt == "blade":
        return _decode_blade(body)
    if fmt == "json":
        return _decode_json(body)
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
        return _decode_json(body)
    kind = sniff(body)
    if kind is not None:
        try:
            return decode(body, kind)
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


# --- validation against a model signature -------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype[Any] | None  # None: any
    shape: tuple[int | str | None, ...] | None  # None: unknown rank; str/None dims are dynamic

    def describe(self) -> str:
        return type_str(self.dtype, self.shape or ())


def _castable(src: np.dtype[Any], dst: np.dtype[Any]) -> bool:
    if dst == np.dtype(object):
        return src.kind in "OUS"
    if src.kind == "O":
        return False
    if src.kind == "b":
        return dst.kind == "b"
    if src.kind in "iu" and dst.kind in "iuf":
        return True
    return src.kind == "f" and dst.kind == "f"


def conform(tensor: Tensor, spec: TensorSpec) -> np.ndarray:
    """Check ``tensor`` against ``spec``; cast loose tensors. Raises InvalidInput."""
    arr = tensor.array
    ok_dtype = spec.dtype is None or arr.dtype == spec.dtype
    if not ok_dtype and spec.dtype is not None:
        if arr.dtype.kind == "O" and spec.dtype.kind == "O":
            ok_dtype = True
        elif tensor.loose and _castable(arr.dtype, spec.dtype):
            with np.errstate(all="ignore"):
                arr = arr.astype(spec.dtype)
            ok_dtype = True
    ok_shape = True
    if spec.shape == () and arr.shape == (1,):
        arr = arr.reshape(())  # one value sent without a shape for a scalar input
    if spec.shape is not None:
        if len(spec.shape) != arr.ndim:
            ok_shape = False
        else:
            for want, got in zip(spec.shape, arr.shape, strict=True):
                if isinstance(want, int) and want >= 0 and want != got:
                    ok_shape = False
                    break
    if not (ok_dtype and ok_shape):
        raise InvalidInput(
            f"input {spec.name!r}: expected {spec.describe()}, got {type_str(arr.dtype, arr.shape)}"
        )
    return arr


def bind_inputs(req: DecodedRequest, specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """Map the request's inputs onto the model's inputs (by name or position) and check them."""
    feeds: dict[str, np.ndarray] = {}
    if req.kind == "torch" and not req.by_map:
        given = req.positional
        if len(given) > len(specs):
            raise InvalidInput(f"the model takes {len(specs)} inputs, got {len(given)}")
        for i, spec in enumerate(specs):
            t = given[i] if i < len(given) else None
            if t is None:
                raise InvalidInput(f"missing input {i} ({spec.name!r}: {spec.describe()})")
            feeds[spec.name] = conform(t, spec)
        return feeds
    known = {s.name for s in specs}
    unknown = [n for n in req.named if n not in known]
    if unknown:
        raise InvalidInput(f"unknown input {unknown[0]!r}; model inputs: {', '.join(s.name for s in specs)}")
    for spec in specs:
        t = req.named.get(spec.name)
        if t is None:
            raise InvalidInput(f"missing input {spec.name!r} ({spec.describe()})")
        feeds[spec.name] = conform(t, spec)
    return feeds


def select_outputs(req: DecodedRequest, output_names: Sequence[str]) -> list[int]:
    """Indices of the model outputs the request asks for (all when it names none)."""
    if req.kind == "torch" and not req.by_map:
        if not req.output_indices:
            return list(range(len(output_names)))
        for i in req.output_indices:
            if not 0 <= i < len(output_names):
                raise InvalidInput(
                    f"output index {i} out of range; the model has {len(output_names)} outputs"
                )
        return list(req.output_indices)
    if not req.output_names:
        return list(range(len(output_names)))
    index = {n: i for i, n in enumerate(output_names)}
    out = []
    for n in req.output_names:
        if n not in index:
            raise InvalidInput(f"unknown output {n!r}; model outputs: {', '.join(output_names)}")
        out.append(index[n])
    return out


# --- encoding ------------------------------------------------------------------------


def _ld(tag: int, payload: bytes) -> bytes:
    """A length-delimited field with a one-byte tag (field numbers < 16)."""
    return bytes((tag,)) + _codec.varint(len(payload)) + payload


def _shape_bytes(shape: Sequence[int]) -> bytes:
    dims = b"".join(_codec.varint(int(d)) for d in shape)
    return _ld(0x0A, dims) if dims else b""


def _tf_wire(arr: np.ndarray, torch: bool) -> tuple[np.ndarray, int]:
    """The numpy array and ArrayDataType a TF/Torch response carries for ``arr``."""
    k = arr.dtype
    if k == np.float32:
        return arr, _TF.DT_FLOAT
    if k == np.float64:
        return arr, _TF.DT_DOUBLE
    if k == np.float16:
        return arr.astype(np.float32), _TF.DT_FLOAT
    if k == np.int64:
        return arr, _TF.DT_INT64
    if k in (np.int32, np.int16, np.int8):
        return arr, {np.dtype(np.int32): _TF.DT_INT32, np.dtype(np.int16): _TF.DT_INT16}.get(k, _TF.DT_INT8)
    if k in (np.uint8, np.uint16):
        # The reference TFResponse.get_values cannot read UINT8/UINT16: answer as INT32.
        return arr.astype(np.int32), _TF.DT_INT32
    if k in (np.uint32, np.uint64):
        return arr.astype(np.int64), _TF.DT_INT64
    if k == np.bool_:
        return (arr.astype(np.int32), _TF.DT_INT32) if torch else (arr, _TF.DT_BOOL)
    if k.kind in "OUS":
        return arr, _TF.DT_STRING
    raise InvalidInput(f"output dtype {k} cannot be encoded")


def _as_bytes_list(arr: np.ndarray) -> list[bytes]:
    return [v if isinstance(v, bytes) else str(v).encode() for v in arr.ravel().tolist()]


# Encoders build lists of pieces (bytes, or memoryviews of numpy data) with their total
# size, so a large tensor is copied once, by the final b"".join.
_Pieces = list[Any]


def _wrap(tag: int, pieces: _Pieces, size: int) -> tuple[_Pieces, int]:
    prefix = bytes((tag,)) + _codec.varint(size)
    return [prefix, *pieces], len(prefix) + size


def _raw_values(tag: int, arr: np.ndarray, layout: str) -> tuple[_Pieces, int]:
    data = memoryview(np.ascontiguousarray(arr, layout).reshape(-1)).cast("B")
    return _wrap(tag, [data], data.nbytes)


@functools.lru_cache(maxsize=1024)
def _array_head(dt: int, shape: tuple[int, ...]) -> bytes:
    # dtype and shape fields: the same few for every answer of a model, so built once.
    return b"\x08" + _codec.varint(dt) + _ld(0x12, _shape_bytes(shape))


@functools.lru_cache(maxsize=1024)
def _name_key(name: str) -> bytes:
    return _ld(0x0A, name.encode())


def _array_proto_pieces(arr: np.ndarray, torch: bool) -> tuple[_Pieces, int]:
    arr, dt = _tf_wire(np.asarray(arr), torch)
    head = _array_head(dt, arr.shape)
    if dt == _TF.DT_FLOAT:
        pieces, size = _raw_values(0x1A, arr, "<f4")
    elif dt == _TF.DT_DOUBLE:
        pieces, size = _raw_values(0x22, arr, "<f8")
    elif dt == _TF.DT_BOOL:
        pieces, size = _raw_values(0x42, arr.astype(np.uint8), "u1")  # packed varints 0/1
    elif dt == _TF.DT_STRING:
        m = _TF.ArrayProto()
        m.string_val.extend(_as_bytes_list(arr))
        rest = m.SerializeToString()
        pieces, size = [rest], len(rest)
    elif arr.size == 0:
        pieces, size = [], 0  # an empty packed field is not written
    else:
        # Packed varints of int64_val (7) or int_val (5), sign-extended as protobuf does.
        if arr.size <= 16:  # a few values: a Python loop beats numpy's set-up cost
            packed = b"".join([_codec.varint(v) for v in arr.ravel().tolist()])
        else:
            packed = _codec.encode_varints(arr)
        pieces, size = _wrap(0x3A if dt == _TF.DT_INT64 else 0x2A, [packed], len(packed))
    return [head, *pieces], len(head) + size


def encode_array_proto(arr: np.ndarray, torch: bool = False) -> bytes:
    """Serialized TF (or Torch) ArrayProto for ``arr``."""
    return b"".join(_array_proto_pieces(arr, torch)[0])


def _map_entry(tag: int, name: str, arr: np.ndarray, torch: bool) -> _Pieces:
    key = _name_key(name)
    value, vsize = _wrap(0x12, *_array_proto_pieces(arr, torch))
    return _wrap(tag, [key, *value], len(key) + vsize)[0]


def encode_tf_response(outputs: Iterable[tuple[str, np.ndarray]]) -> bytes:
    parts: _Pieces = []
    for name, arr in outputs:
        parts += _map_entry(0x0A, name, arr, torch=False)
    return b"".join(parts)


def encode_torch_response(
    outputs: Iterable[np.ndarray], named: Iterable[tuple[str, np.ndarray]] = ()
) -> bytes:
    parts: _Pieces = []
    for arr in outputs:
        parts += _wrap(0x0A, *_array_proto_pieces(arr, torch=True))[0]
    for name, arr in named:
        parts += _map_entry(0x12, name, arr, torch=True)
    return b"".join(parts)


_BLADE_CAST = {
    blade_pb2.DT_FLOAT: np.float32,
    blade_pb2.DT_INT32: np.int32,
    blade_pb2.DT_INT64: np.int64,
    blade_pb2.DT_STRING: object,
}


def _blade_array_pieces(name: str, arr: np.ndarray, data_type: int = 0) -> _Pieces:
    """Pieces of one ``Response.outputs`` field (tag, length and the Array message)."""
    arr = np.asarray(arr)
    want = _BLADE_CAST.get(data_type)
    if want is object:
        arr = arr.astype(object) if arr.dtype.kind not in "OUS" else arr
    elif want is not None and arr.dtype.kind not in "OUS":
        arr = arr.astype(want)
    k = arr.dtype
    nb = name.encode()
    batch = int(arr.shape[0]) if arr.ndim else 1
    head = (
        _ld(0x0A, nb)
        + _ld(0x12, nb)
        + b"\x18"
        + _codec.varint(batch & 0xFFFFFFFF)
        + _ld(0x22, _shape_bytes(arr.shape))
    )
    if k.kind == "f":
        pieces, size = _raw_values(0x2A, arr, "<f4")
        return _wrap(0x0A, [head, *pieces], len(head) + size)[0]
    m = blade_pb2.Array()
    if k.kind in "OUS":
        m.string_val.extend(_as_bytes_list(arr))
    elif k in (np.int64, np.uint32, np.uint64):
        m.int64_val.extend(arr.astype(np.int64).ravel().tolist())
    elif k.kind in "iub":
        m.int_val.extend(arr.astype(np.int32).ravel().tolist())
    else:
        raise InvalidInput(f"output dtype {k} cannot be encoded")
    body = head + m.SerializePartialToString()
    return _wrap(0x0A, [body], len(body))[0]


def encode_blade_response(
    outputs: Iterable[tuple[str, np.ndarray]], types: Mapping[str, int] | None = None
) -> bytes:
    types = types or {}
    parts: _Pieces = []
    for name, arr in outputs:
        parts += _blade_array_pieces(name, arr, types.get(name, 0))
    return b"".join(parts)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError


def _json_data(arr: np.ndarray) -> Any:
    if arr.dtype.kind in "OUS":
        return [
            v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in arr.ravel().tolist()
        ]
    if arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    flat = np.ascontiguousarray(arr).ravel()
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():
        # JSON has no NaN/Infinity: encode them as null.
        return [None if not math.isfinite(v) else v for v in flat.tolist()]
    return flat


def encode_json_response(outputs: Iterable[tuple[str, np.ndarray]]) -> bytes:
    doc = {
        "outputs": {
            name: {"dtype": dtype_name(arr.dtype), "shape": list(arr.shape), "data": _json_data(arr)}
            for name, arr in outputs
        }
    }
    if _orjson is not None:
        return _orjson.dumps(doc, option=_orjson.OPT_SERIALIZE_NUMPY, default=_json_default)
    return json.dumps(
        doc, default=lambda o: o.tolist() if isinstance(o, np.ndarray) else _json_default(o)
    ).encode()


def encode_response(
    req: DecodedRequest, names: Sequence[str], arrays: Sequence[np.ndarray], indices: Sequence[int]
) -> tuple[bytes, str]:
    """Encode the selected outputs in the request's own format; returns (body, content type)."""
    sel = [(names[i], arrays[i]) for i in indices]
    if req.kind == "tf":
        return encode_tf_response(sel), CONTENT_TYPE_PROTOBUF
    if req.kind == "torch":
        if req.by_map:
            return encode_torch_response((), sel), CONTENT_TYPE_PROTOBUF
        return encode_torch_response(a for _, a in sel), CONTENT_TYPE_PROTOBUF
    if req.kind == "blade":
        return encode_blade_response(sel, req.output_types), CONTENT_TYPE_PROTOBUF
    return encode_json_response(sel), CONTENT_TYPE_JSON
