"""V2 (Open Inference Protocol) inference over REST: requests to tensors, tensors to answers.

Parsing and answer building only (no I/O). A request's inputs become numpy arrays, whether
they came as JSON ``data`` or as binary tensors (``gateway.codecs.v2_binary``), mixed
freely in one request; the route runs them with ``DataPlane.tensors_call`` (the worker's
TF protobuf path, so the worker checks dtypes and shapes as for an EAS call) and this module
writes the output arrays back, each as JSON ``data`` or binary as the request asks
(``binary_data`` per output, ``binary_data_output`` for all), or as its top-k classes
(``gateway.codecs.v2_classification``); an answer past the response limit is refused
before it is built (``gateway.core.json_answer``). Errors are
:class:`KServeRequestError` (400).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.codecs import v2_tensors
from gateway.codecs.kserve import BINARY_HEADER, KServeRequestError, flatten, loads
from gateway.codecs.v2_binary import BinarySection, frame, header_length, output_bytes
from gateway.codecs.v2_classification import class_count, classify
from gateway.core import json_answer

MAX_INPUTS = 1024
MAX_OUTPUTS = 1024
# Up to this many values a float tensor's flat JSON list is read by struct (json_tensor),
# whose call takes the values as arguments: a tuple of 8 bytes a value, beside the array.
# Past it numpy reads the list, and its fixed cost, which struct saves, no longer matters.
STRUCT_MAX_VALUES = 1 << 16
# A JSON-only request's (holds nothing, so it is shared): refuses binary_data_size.
_NO_BINARY = BinarySection(b"", None)


# Plain slotted dataclasses, not frozen ones: a frozen dataclass sets each field through
# object.__setattr__, which made building these two a sixth of decoding a small request.
# Nothing changes them once parse_request has built them.
@dataclass(slots=True)
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: as the request's binary_data_output says
    classification: int = 0  # k of the classification extension; 0: the tensor itself


@dataclass(slots=True)
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: tuple[RequestedOutput, ...]  # in the order asked; empty: all, in the model's order
    binary_output: bool = False
    parameters: Mapping[str, Any] = field(default_factory=dict)  # the request's, as sent

    @property
    def output_names(self) -> tuple[str, ...]:
        if not self.outputs:  # most calls: every output
            return ()
        return tuple(o.name for o in self.outputs)


def _params(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise KServeRequestError(f"{where}: parameters must be an object")
    if "shared_memory_region" in raw:
        raise KServeRequestError(f"{where}: the shared memory extension is not supported; send the data")
    return raw


def _flag(params: Mapping[str, Any], key: str, where: str) -> bool | None:
    value = params.get(key)
    if value is not None and not isinstance(value, bool):
        raise KServeRequestError(f"{where}: parameter {key!r} must be true or false")
    return value


def json_tensor(data: Any, datatype: str, shape: list[int], where: str) -> np.ndarray:
    """A tensor given as JSON ``data`` (flat or nested, row-major), in ``datatype``'s dtype."""
    dt = v2_tensors.DATATYPES[datatype]
    if not isinstance(data, list):
        raise KServeRequestError(f"{where}: data must be a list")
    count = math.prod(shape)
    if dt.kind == "f" and 0 < count <= STRUCT_MAX_VALUES and len(data) == count:
        # A flat list of numbers for a float tensor (most calls): struct reads it into the
        # array's own memory at a third of what numpy's discovery of a list's types and shape
        # costs. Anything else it refuses (a nested list, a string, null, a number past
        # float64's range) takes the paths below, which name what is wrong.
        arr = np.empty(count, np.float64)
        try:
            struct.pack_into(f"{count}d", arr, 0, *data)
        except (struct.error, OverflowError):
            pass
        else:
            return arr.astype(dt, copy=False).reshape(shape)
    if datatype != "BYTES" and data:
        # Regular numbers, flat or nested evenly: numpy reads them in one pass. Anything else
        # (ragged nesting, strings, objects) takes the checked path below.
        try:
            arr = np.asarray(data)
        except (ValueError, OverflowError):
            arr = np.empty(0, dtype=object)
        if arr.dtype.kind in "biuf" and arr.size == count:
            if dt.kind == "f":  # any number is a float: nothing to check
                return arr.astype(dt, copy=False).reshape(shape)
            return _numbers(arr, dt, datatype, where).reshape(shape)
    flat = flatten(data, where)
    if len(flat) != count:
        raise KServeRequestError(f"{where}: shape {shape} needs {count} values, got {len(flat)}")
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise KServeRequestError(f"{where}: BYTES data must be strings")
        out = np.empty(count, dtype=object)
        out[:] = [v.encode() for v in flat]
        return out.reshape(shape)
    if not flat:
        return np.empty(shape, dtype=dt)
    try:
        arr = np.asarray(flat)
    except (ValueError, OverflowError):
        arr = np.empty(0, dtype=object)
    return _numbers(arr, dt, datatype, where).reshape(shape)


def _numbers(arr: np.ndarray, dt: np.dtype[Any], datatype: str, where: str) -> np.ndarray:
    """``arr`` (as numpy read the JSON values) in ``dt``, refused unless every value fits."""
    kind = arr.dtype.kind
    if dt.kind == "b":
        ok = kind == "b"
    elif dt.kind in "iu":
        ok = kind in "biu" and int(arr.min()) >= np.iinfo(dt).min and int(arr.max()) <= np.iinfo(dt).max
    else:
        ok = kind in "biuf"
    if not ok:
        raise KServeRequestError(f"{where}: data are not all {datatype} values")
    return arr.astype(dt, copy=False)


def parse_request(body: bytes, binary_header: str | None = None) -> InferRequest:
    """A V2 inference request: JSON, or a JSON header of ``binary_header`` bytes (the
    ``Inference-Header-Content-Length`` value) followed by binary tensors."""
    hlen = header_length(binary_header, len(body))
    if hlen is None:
        doc = loads(body)
    else:
        try:
            doc = loads(body[:hlen])  # a copy of the header only
        except KServeRequestError as exc:
            raise KServeRequestError(f"the JSON header ({BINARY_HEADER}: {hlen}): {exc}") from None
    if not isinstance(doc, dict):
        raise KServeRequestError("body must be a JSON object")
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise KServeRequestError('"id" must be a string')
    # Absent parameters and outputs (most calls) skip their checks' calls.
    params = doc.get("parameters")
    request_params = _params(params, "request") if params is not None else {}
    binary_output = bool(request_params) and bool(_flag(request_params, "binary_data_output", "request"))
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise KServeRequestError('"inputs" must be a non-empty list')
    if len(raw_inputs) > MAX_INPUTS:
        raise KServeRequestError(f'"inputs" has more than {MAX_INPUTS} entries')
    section = BinarySection(body, hlen) if hlen is not None else _NO_BINARY
    inputs: dict[str, np.ndarray] = {}
    for i, t in enumerate(raw_inputs):
        where = f"inputs[{i}]"
        if not isinstance(t, dict):
            raise KServeRequestError(f"{where}: must be an object")
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise KServeRequestError(f"{where}: name must be a non-empty string")
        where = f"input '{name}'"
        if name in inputs:
            raise KServeRequestError(f"{where}: given twice")
        datatype = t.get("datatype")
        if not isinstance(datatype, str) or datatype not in v2_tensors.DATATYPES:
            names = ", ".join(v2_tensors.DATATYPES)
            raise KServeRequestError(f"{where}: datatype {str(datatype)[:32]!r} is not one of {names}")
        try:
            shape = v2_tensors.check_shape(t.get("shape"), where)
        except v2_tensors.TensorError as exc:
            raise KServeRequestError(str(exc)) from None
        params = t.get("parameters")
        if params is not None and _params(params, where).get("binary_data_size") is not None:
            if "data" in t:
                raise KServeRequestError(f"{where}: has both data and binary_data_size")
            inputs[name] = section.tensor(params["binary_data_size"], datatype, shape, where)
        else:
            inputs[name] = json_tensor(t.get("data"), datatype, shape, where)
    section.finish()
    outputs = doc.get("outputs")
    asked = () if outputs is None else _outputs(outputs)
    return InferRequest(rid, inputs, asked, binary_output, request_params)


def _outputs(raw: Any) -> tuple[RequestedOutput, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise KServeRequestError('"outputs" must be a list')
    if len(raw) > MAX_OUTPUTS:
        raise KServeRequestError(f'"outputs" has more than {MAX_OUTPUTS} entries')
    out: list[RequestedOutput] = []
    seen: set[str] = set()
    for j, o in enumerate(raw):
        name = o.get("name") if isinstance(o, dict) else None
        if not isinstance(name, str) or not name:
            raise KServeRequestError(f"outputs[{j}]: name must be a non-empty string")
        if name in seen:
            raise KServeRequestError(f"output '{name}': requested twice")
        seen.add(name)
        if len(o) == 1:  # the name alone, as most requests ask: nothing else to read
            out.append(RequestedOutput(name))
            continue
        where = f"output '{name}'"
        params = _params(o.get("parameters"), where)
        k = params.get("classification")
        out.append(
            RequestedOutput(
                name, _flag(params, "binary_data", where), 0 if k is None else class_count(k, where)
            )
        )
    return tuple(out)


def answer(
    model_name: str,
    version: str,
    req: InferRequest,
    arrays: Mapping[str, np.ndarray],
    model_order: Sequence[str] = (),
    labels: Mapping[str, Sequence[str]] | None = None,
    limit: int = 0,
) -> tuple[bytes | bytearray, int | None]:
    """The V2 answer for the output ``arrays``: (body, JSON header length when binary tensors
    follow it, else None). Without requested outputs: every output, in ``model_order``.
    JSON ``data`` is written straight from the arrays, binary tensors as views of them; an
    answer past ``limit`` bytes (0: none) raises json_answer.AnswerTooLarge, before anything
    is built when its estimate says so."""
    wanted: Sequence[RequestedOutput | str] = req.outputs
    if not wanted:  # every output, as plain names; most answers list them in the model's order
        names = list(arrays)
        if names != model_order:
            names = [n for n in model_order if n in arrays] + [n for n in names if n not in model_order]
        wanted = names
    entries: list[dict[str, Any]] = []
    binary: list[np.ndarray] = []
    in_json: list[tuple[dict[str, Any], str]] = []  # where the arrays written as JSON are
    raw = 0  # bytes of the binary tensors after the header
    for o in wanted:
        if type(o) is str:
            name, as_binary, k = o, req.binary_output, 0
        else:
            name, k = o.name, o.classification
            as_binary = req.binary_output if o.binary is None else o.binary
        try:
            arr = arrays[name]
        except KeyError:
            raise KeyError(f"the worker's answer has no output {name!r}") from None
        if k:
            arr = classify(arr, k, f"output '{name}'", (labels or {}).get(name, ()))
        try:
            datatype = v2_tensors.BY_DTYPE[arr.dtype]
        except KeyError:  # strings, byte-swapped numbers, or no V2 datatype at all
            datatype = v2_tensors.datatype_of(arr)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if as_binary:
            size = json_answer.raw_size(arr)
            entry["parameters"] = {"binary_data_size": size}
            raw += size
            binary.append(arr)
        else:
            entry["data"] = arr.reshape(-1)  # V2's JSON data is flat
            in_json.append((entry, "data"))
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": version, "outputs": entries}
    if req.id is not None:
        doc["id"] = req.id
    header = json_answer.small_with(doc, in_json)  # most answers: encoded once, measured after
    if header is not None:
        if limit and len(header) + raw > limit:
            json_answer.check(len(header) + raw, limit)
    else:
        if limit:
            json_answer.check(json_answer.estimate(doc) + raw, limit, "about")
        header = json_answer.dumps(doc, max(1, limit - raw) if limit else 0)
    if not binary:
        return header, None
    return frame(header, [output_bytes(a) for a in binary])


__all__ = ["MAX_INPUTS", "InferRequest", "RequestedOutput", "answer", "json_tensor", "parse_request"]
