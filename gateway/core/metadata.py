"""What a processor says about its model: its input and output tensors.

A worker asks its processor once, after loading, and sends the answer to the gateway
with its readiness; the pool keeps it (``WorkerPool.metadata``), so a client asking for
a model's metadata (KServe ``GET /v2/models/<name>``) is answered without touching the
model file in the gateway process. Plain data only: it travels over the worker's pipe.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from eas_sdk.codecs.eas import binding

# The KServe V2 datatype names: the vocabulary every TensorSpec uses.
V2_DATATYPES = frozenset(
    {
        "BOOL",
        "UINT8",
        "UINT16",
        "UINT32",
        "UINT64",
        "INT8",
        "INT16",
        "INT32",
        "INT64",
        "FP16",
        "FP32",
        "FP64",
        "BF16",
        "BYTES",
    }
)
# A tensor whose element type has no V2 name, or a value that is not a tensor (a map, a sequence).
UNKNOWN = "UNKNOWN"
# The platform of an existing ``kserve.Model`` served as it is (gateway.worker.processors.
# kserve_model): its KServe V1 calls are handed to it as they came, and answered as it answers.
KSERVE_PLATFORM = "kserve"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # a V2 datatype name ("FP32", "INT64", "BYTES", ...) or UNKNOWN
    shape: tuple[int, ...]  # -1 for a dimension of any size

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> TensorSpec:
        """``{"name", "datatype", "shape"}``, as a user's processor declares it."""
        if not isinstance(doc, Mapping):
            raise TypeError(f"{where}: expected an object with name, datatype and shape")
        name, datatype, shape = doc.get("name"), doc.get("datatype", UNKNOWN), doc.get("shape", ())
        if not isinstance(name, str) or not name:
            raise TypeError(f"{where}: name must be a non-empty string")
        if datatype != UNKNOWN and datatype not in V2_DATATYPES:
            raise TypeError(f"{where}: datatype {str(datatype)[:32]!r} is not one of {sorted(V2_DATATYPES)}")
        if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape
        ):
            raise TypeError(f"{where}: shape must be a list of integers (-1 for any size)")
        return cls(name, datatype, tuple(shape))


@dataclass(frozen=True)
class ModelMetadata:
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    platform: str = ""  # e.g. "onnxruntime_onnx"; empty when the processor does not say
    versions: tuple[str, ...] = ("1",)  # a service serves one version of its model
    # Whether the model answers an explain call (KServe's ``:explain``) itself: user code
    # with an ``explain`` method (gateway.worker.processors.python).
    explains: bool = False
    # Whether the workers refuse (400, naming the input) what ``inputs`` do not fit, as the
    # model runtimes do (gateway.worker.processors.model); what user code declares is only
    # checked where it says so. Only then may the gateway refuse such a call before sending
    # it (:func:`misfit`).
    checks_inputs: bool = False

    @property
    def tensors(self) -> bool:
        """Whether the model declares its inputs: what the model protocols need to call it."""
        return bool(self.inputs)

    @classmethod
    def from_json(cls, doc: Any) -> ModelMetadata:
        """``{"inputs": [...], "outputs": [...], "platform": "..."}``; every key optional."""
        if isinstance(doc, ModelMetadata):
            return doc
        if not isinstance(doc, Mapping):
            raise TypeError(f"metadata() returned {type(doc).__name__}; expected a mapping or ModelMetadata")
        platform = doc.get("platform", "")
        if not isinstance(platform, str):
            raise TypeError("metadata(): platform must be a string")
        tensors: dict[str, tuple[TensorSpec, ...]] = {}
        for key in ("inputs", "outputs"):
            items = doc.get(key, ())
            if not isinstance(items, (list, tuple)):
                raise TypeError(f"metadata(): {key} must be a list")
            where = f"metadata(): {key}"
            tensors[key] = tuple(TensorSpec.from_json(t, f"{where}[{i}]") for i, t in enumerate(items))
        flags = {key: doc.get(key, False) for key in ("explains", "checks_inputs")}
        for key, value in flags.items():
            if not isinstance(value, bool):
                raise TypeError(f"metadata(): {key} must be true or false")
        return cls(tensors["inputs"], tensors["outputs"], platform, **flags)


# V2 datatype -> numpy dtype (little-endian, as on the wire). BYTES elements are bytes objects.
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}


def declared_dtypes(meta: ModelMetadata | None) -> dict[str, np.dtype[Any]]:
    """Output name -> the dtype a model's metadata declares (None: nothing is known)."""
    outputs = meta.outputs if meta is not None else ()
    return {t.name: DATATYPES[t.datatype] for t in outputs if t.datatype in DATATYPES}


def misfit(
    meta: ModelMetadata | None,
    inputs: Mapping[str, tuple[np.dtype[Any], tuple[int, ...]]],
    loose: Collection[str] = (),
) -> str | None:
    """The 400 message the model's workers answer ``inputs`` (name -> (dtype, shape)) with
    when their signature refuses a dtype or shape (gateway.worker.processors.model), or None:
    they take them, or only the workers can say (no checked signature, an input missing or
    unknown, which they name in their own words). ``loose``: the inputs whose wire form
    states no dtype (JSON numbers), which the workers cast where that is safe. Needs no
    element: a call can be refused before anything is built from its values."""
    if meta is None or not meta.checks_inputs:
        return None
    if len(inputs) != len(meta.inputs) or any(t.name not in inputs for t in meta.inputs):
        return None
    for t in meta.inputs:
        dtype, shape = inputs[t.name]
        # An unknown rank reads as () in metadata: only a shape of known rank is checked.
        dims = tuple(None if d < 0 else d for d in t.shape) if t.shape else None
        spec = binding.TensorSpec(t.name, DATATYPES.get(t.datatype), dims)
        message = binding.refusal(spec, dtype, tuple(shape), t.name in loose)
        if message is not None:
            return message
    return None


__all__ = [
    "DATATYPES",
    "KSERVE_PLATFORM",
    "UNKNOWN",
    "V2_DATATYPES",
    "ModelMetadata",
    "TensorSpec",
    "declared_dtypes",
    "misfit",
]
