"""Paddle Serving's pipeline gRPC messages (``PipelineService/inference``), read and answered.

A ``Request`` carries its inputs in one of two forms, as ``PipelineClient.predict`` packs them:

* key/value strings (the default): each value is a NumPy repr when the client was given an
  array or a list (``array([[0.5, 1. ]], dtype=float32)``, the whole tensor), or the
  caller's own text: a JSON array, numbers separated by commas (one instance) or any other
  string, read as the HTTP key/value form reads it (gateway.codecs.paddle). A repr is
  parsed as a literal, never evaluated: nested lists of numbers inside ``array(...)`` with
  an optional ``dtype``; anything else is refused with the value's name.
* ``Tensor`` messages (``pack_tensor_format=True``): typed data with its shape, a string
  tensor's ``str_data``, or ``np.save``'s bytes (``use_tensor_bytes=True``, read without
  pickles).

The answer is Paddle's: ``err_no`` 0, each output's name in ``key`` and its NumPy repr (a
string output: its text) in ``value``. An error is ``err_no``/``err_msg`` with Paddle's code
for it (gateway/codecs/errors.py maps the gateway's statuses onto them).
"""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway._proto import pipeline_service_pb2 as pb
from gateway.codecs import paddle

SERVICE = "baidu.paddle_serving.pipeline_serving.PipelineService"
METHOD_PATH = f"/{SERVICE}/inference"
# Paddle's keys that are not inputs: the client's profiling switch.
_NOT_INPUTS = frozenset({"pipeline.profile"})
MAX_DEPTH = 32

# Paddle's elem_type codes (paddle_serving_server/pipeline/operator.py).
_ELEM_DTYPES = {
    0: ("int64", "int64_data"),
    1: ("float32", "float_data"),
    2: ("int32", "int_data"),
    3: ("float64", "float64_data"),
    4: ("int16", "int_data"),
    5: ("float16", "float_data"),
    6: ("uint16", "uint32_data"),
    7: ("uint8", "uint32_data"),
    8: ("int8", "int_data"),
    9: ("bool", "bool_data"),
}
STRING, BYTES = 12, 13
_DTYPES = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    }
)


class PipelineRequestError(paddle.PaddleRequestError):
    """A request message or value that cannot be read: Paddle's input error."""


@dataclass
class PipelineCall:
    inputs: dict[str, Any]
    log_id: int = 0
    fetch: list[str] = field(default_factory=list)

    def json_form(self) -> bytes:
        """The onnx processor's JSON request for these inputs."""
        return paddle.dumps({"inputs": self.inputs, "outputs": self.fetch})


# --- NumPy reprs as literals ----------------------------------------------------------------

_REPR = re.compile(r"\s*array\((?P<body>.*?)(?:,\s*dtype=(?P<q>['\"]?)(?P<dtype>\w+)(?P=q))?\)\s*", re.DOTALL)
_TOKEN = re.compile(
    r"\s*(?:(?P<open>\[)|(?P<close>\])|(?P<comma>,)"
    r"|(?P<num>[-+]?(?:nan|inf|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?))|(?P<bool>True|False))"
)


def _literal(text: str, name: str) -> Any:
    """Nested lists of numbers (NumPy's repr of them: ``1.``, ``nan``, ``-inf``, ``True``),
    read token by token: a number or a list, nothing else."""
    stack: list[list[Any]] = [[]]
    pos, end, expect_value = 0, len(text.rstrip()), True
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None:
            raise PipelineRequestError(f"value of {name!r}: not a literal array at {text[pos : pos + 24]!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind == "open":
            if not expect_value:
                raise PipelineRequestError(f"value of {name!r}: not a literal array (misplaced '[')")
            if len(stack) > MAX_DEPTH:
                raise PipelineRequestError(f"value of {name!r}: nested deeper than {MAX_DEPTH} levels")
            stack.append([])
        elif kind == "close":
            if len(stack) == 1:
                raise PipelineRequestError(f"value of {name!r}: not a literal array (unbalanced ']')")
            done = stack.pop()
            stack[-1].append(done)
            expect_value = False
        elif kind == "comma":
            if expect_value:
                raise PipelineRequestError(f"value of {name!r}: not a literal array (misplaced ',')")
            expect_value = True
        else:
            if not expect_value:
                raise PipelineRequestError(f"value of {name!r}: not a literal array (missing ',')")
            word = m.group(kind)
            if kind == "bool":
                stack[-1].append(word == "True")
            else:
                stack[-1].append(float(word) if re.search(r"[.eEni]", word) else int(word))
            expect_value = False
    if len(stack) != 1 or len(stack[0]) != 1:
        raise PipelineRequestError(f"value of {name!r}: not a literal array")
    return stack[0][0]


def numpy_literal(text: str, name: str = "value") -> np.ndarray:
    """``array([[0.5, 1. ]], dtype=float32)`` -> that array, without evaluating anything."""
    m = _REPR.fullmatch(text)
    if m is None:
        raise PipelineRequestError(f"value of {name!r}: not a NumPy array repr")
    dtype = m.group("dtype")
    if dtype is not None and dtype not in _DTYPES:
        raise PipelineRequestError(f"value of {name!r}: dtype {dtype!r} is not a numeric type")
    nested = _literal(m.group("body"), name)
    try:
        return np.array(nested, dtype=dtype)
    except (ValueError, OverflowError) as exc:
        raise PipelineRequestError(f"value of {name!r}: not a rectangular array ({exc})") from None


def _text(name: str, value: str) -> Any:
    if value.lstrip().startswith("array("):
        return numpy_literal(value, name)
    try:
        return [paddle.text_value(value)]  # the caller's own text: one instance
    except paddle.PaddleRequestError as exc:
        raise PipelineRequestError(f"value of {name!r}: {exc}") from None


# --- Tensor messages ------------------------------------------------------------------------


def _tensor(t: Any) -> Any:
    name = t.name
    if not name:
        raise PipelineRequestError("a tensor has no name")
    if t.elem_type == STRING:
        return ["".join(t.str_data)]  # Paddle joins a string tensor's pieces
    if t.elem_type == BYTES:
        try:
            return np.load(io.BytesIO(t.byte_data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise PipelineRequestError(
                f"tensor {name!r}: byte_data is not an array np.save wrote ({exc})"
            ) from None
    spec = _ELEM_DTYPES.get(t.elem_type)
    if spec is None:
        raise PipelineRequestError(f"tensor {name!r}: elem_type {t.elem_type} is not supported")
    dtype, attr = spec
    arr = np.asarray(getattr(t, attr), dtype=dtype)
    shape = tuple(t.shape)
    if shape:
        if any(d < 0 for d in shape) or int(np.prod(shape)) != arr.size:
            raise PipelineRequestError(
                f"tensor {name!r}: shape {list(shape)} does not hold its {arr.size} values"
            )
        arr = arr.reshape(shape)
    return arr


def parse(body: bytes) -> PipelineCall:
    """A serialized ``Request`` -> the call's inputs, each an array or a batch of one text."""
    req = pb.Request()
    try:
        req.ParseFromString(body)
    except Exception:  # protobuf's DecodeError, whose module differs between runtimes
        raise PipelineRequestError("the request is not a pipeline Request message") from None
    if len(req.key) != len(req.value):
        raise PipelineRequestError(f"{len(req.key)} keys but {len(req.value)} values")
    inputs: dict[str, Any] = {}
    for key, value in zip(req.key, req.value, strict=True):
        if key not in _NOT_INPUTS:
            inputs[key] = _text(key, value)
    for t in req.tensors:
        inputs[t.name] = _tensor(t)
    if not inputs:
        raise PipelineRequestError("the request has no inputs (neither key/value nor tensors)")
    return PipelineCall(inputs, log_id=req.logid)


# --- answers --------------------------------------------------------------------------------


def _repr(arr: np.ndarray) -> str:
    if arr.dtype.kind in "OSU" and arr.size == 1:
        item = arr.reshape(-1)[0]
        return item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
    with np.printoptions(threshold=sys.maxsize):
        return repr(arr)


def answer(outputs: Mapping[str, np.ndarray], fetch: list[str] | None = None) -> bytes:
    """Paddle's answer: each output (those of ``fetch`` when given) as its NumPy repr."""
    resp = pb.Response(err_no=0, err_msg="")
    for name, arr in outputs.items():
        if fetch and name not in fetch:
            continue
        resp.key.append(name)
        resp.value.append(_repr(np.asarray(arr)))
    return resp.SerializeToString()


def error(err_no: int, err_msg: str) -> bytes:
    return pb.Response(err_no=err_no, err_msg=err_msg).SerializeToString()


__all__ = [
    "METHOD_PATH",
    "SERVICE",
    "PipelineCall",
    "PipelineRequestError",
    "answer",
    "error",
    "numpy_literal",
    "parse",
]
