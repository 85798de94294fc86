"""User code over named tensors: what a ``python`` processor declares and how its calls bind.

A class that declares its inputs (a ``metadata()`` method, or ``inputs``/``outputs`` class
attributes beside a ``predict`` method) is a model to the gateway's model protocols: KServe
V1 and V2 (REST and gRPC), Triton's clients, Paddle and Cluster Serving. Its calls reach
``predict(inputs)`` (and ``explain(inputs)``) as numpy arrays, checked against the
declaration exactly as an ONNX model's inputs are (a wrong dtype or shape is a 400 that names
the input), and what it returns is checked against the declared outputs and answered in the
call's own form. Plain data only; the processor (gateway.worker.processors.python) decides
which calls take this path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from eas_sdk.codecs import eas
from gateway.config import ServiceConfig
from gateway.core.metadata import DATATYPES, UNKNOWN, ModelMetadata, TensorSpec
from gateway.worker.processors.base import ProcessorError

# What ``predict`` and ``explain`` may return: a mapping by output name, a sequence in the
# declared outputs' order, or one array when one output is declared.
RETURNS = "a mapping of output name to array, a list in the declared outputs' order, or one array"


def declared(obj: Any, has_predict: bool, service: ServiceConfig | None = None) -> ModelMetadata:
    """The tensors: the service's ``inputs``/``outputs`` when its config declares them (the
    operator's word wins), else what the class's ``metadata()`` returns, else (for a class
    with ``predict``) its ``inputs`` and ``outputs`` attributes; empty when nothing declares
    them. A malformed declaration raises TypeError naming the field."""
    if service is not None and service.inputs:
        specs = {
            key: tuple(TensorSpec(d.name, d.dtype or UNKNOWN, tuple(d.shape or ())) for d in decls)
            for key, decls in (("inputs", service.inputs), ("outputs", service.outputs))
        }
        return ModelMetadata(specs["inputs"], specs["outputs"])
    method = getattr(obj, "metadata", None)
    if callable(method):
        return ModelMetadata.from_json(method())
    if not has_predict:
        return ModelMetadata()
    # Lists on the class only: an instance's own ``inputs`` (set in initialize), or a class
    # attribute of another kind, is the code's own business, not a declaration.
    cls = type(obj)
    doc: dict[str, Any] = {}
    for key in ("inputs", "outputs"):
        items = getattr(cls, key, None)
        if isinstance(items, (list, tuple)):
            doc[key] = [t.as_json() if isinstance(t, TensorSpec) else t for t in items]
    platform = getattr(cls, "platform", None)
    if doc and isinstance(platform, str):
        doc["platform"] = platform
    return ModelMetadata.from_json(doc)


def _eas_spec(t: TensorSpec) -> eas.TensorSpec:
    # -1 is a dimension of any size (eas treats a negative one as dynamic); a datatype numpy
    # has not (BF16) or UNKNOWN accepts any dtype.
    return eas.TensorSpec(t.name, DATATYPES.get(t.datatype), tuple(t.shape))


@dataclass(frozen=True)
class Binding:
    """A declaration, ready to check calls against."""

    inputs: tuple[eas.TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @classmethod
    def of(cls, meta: ModelMetadata) -> Binding:
        return cls(tuple(_eas_spec(t) for t in meta.inputs), meta.outputs)

    def bind(self, decoded: eas.DecodedRequest) -> dict[str, np.ndarray]:
        """The call's inputs, checked against the declaration (ProcessorError 400 naming the input)."""
        try:
            return eas.bind_inputs(decoded, self.inputs)
        except eas.InvalidInput as exc:
            raise ProcessorError(exc.message) from None

    def outputs_of(self, result: Any, method: str, *, every: bool = True) -> dict[str, np.ndarray]:
        """What ``method`` returned, as arrays by output name, each checked against its
        declaration (cast when that loses nothing of its kind). ``every``: each declared
        output must be there (predict); else (explain) a mapping may name tensors of its own.
        A result that does not fit is the code's defect: 500 naming the output."""
        names = [t.name for t in self.outputs]
        if isinstance(result, Mapping):
            items = {str(k): v for k, v in result.items()}
            missing = [n for n in names if n not in items] if every else []
            if missing:
                raise ProcessorError(f"{method}() returned no output {missing[0]!r}", 500, "ProcessorError")
        elif isinstance(result, np.ndarray) and len(names) == 1:
            items = {names[0]: result}
        elif isinstance(result, (list, tuple)) and names and len(result) == len(names):
            items = dict(zip(names, result, strict=True))
        else:
            what = type(result).__name__
            raise ProcessorError(f"{method}() returned {what}; expected {RETURNS}", 500, "ProcessorError")
        by_spec = {t.name: t for t in self.outputs}
        return {name: _checked(name, value, by_spec.get(name), method) for name, value in items.items()}


def _checked(name: str, value: Any, spec: TensorSpec | None, method: str) -> np.ndarray:
    def fail(detail: str) -> ProcessorError:
        return ProcessorError(f"{method}() output {name!r}: {detail}", 500, "ProcessorError")

    want = DATATYPES.get(spec.datatype) if spec is not None else None
    try:
        arr = np.asarray(value, dtype=object) if want is not None and want.kind == "O" else np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise fail(f"not an array ({exc})") from None
    if arr.dtype.kind in "US":  # text: BYTES elements, as the codecs carry them
        arr = arr.astype(object)
    if arr.dtype.kind == "O":
        if want is not None and want.kind != "O":
            raise fail(f"text or objects, declared {spec.datatype if spec else ''}")
        arr = _as_bytes(arr)
    elif want is not None and arr.dtype != want:
        if want.kind == "O" or not np.can_cast(arr.dtype, want, "same_kind"):
            raise fail(f"{arr.dtype} cannot be answered as the declared {spec.datatype if spec else ''}")
        arr = arr.astype(want)
    if spec is not None and spec.datatype in DATATYPES:
        shape = spec.shape
        if len(shape) != arr.ndim or any(d >= 0 and d != g for d, g in zip(shape, arr.shape, strict=True)):
            got = list(arr.shape)
            raise fail(f"shape {got}, declared {list(shape)}")
    return arr


def _as_bytes(arr: np.ndarray) -> np.ndarray:
    out = np.empty(arr.shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(arr.reshape(-1).tolist()):
        flat[i] = v if isinstance(v, bytes) else str(v).encode()
    return out


def select(decoded: eas.DecodedRequest, names: Sequence[str]) -> list[int]:
    """The indices of the outputs the call asks for (all when it names none)."""
    try:
        return eas.select_outputs(decoded, names)
    except eas.InvalidInput as exc:
        raise ProcessorError(exc.message) from None


__all__ = ["RETURNS", "Binding", "declared", "select"]
