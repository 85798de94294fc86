"""The pipeline config's vocabulary: dtype spellings and the built-in transforms' signatures
(their implementations are in gateway.worker.ops)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import PurePath

from gateway.config.image_transforms import IMAGE_DTYPES, IMAGE_TRANSFORMS

# Config dtype spellings -> the V2 datatype names the rest of the gateway uses.
DTYPES: dict[str, str] = {
    "float32": "FP32", "float": "FP32", "fp32": "FP32", "float64": "FP64", "double": "FP64",
    "fp64": "FP64", "float16": "FP16", "fp16": "FP16", "int8": "INT8", "int16": "INT16",
    "int32": "INT32", "int64": "INT64", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
    "uint64": "UINT64", "bool": "BOOL", "string": "BYTES", "str": "BYTES", "bytes": "BYTES",
}  # fmt: skip

# Built-in transforms: their input names, their output names and the args they take.
TRANSFORMS: dict[str, tuple[tuple[str, ...], tuple[str, ...], frozenset[str]]] = {
    "topk": (("x",), ("indices", "values"), frozenset({"k"})),
    "argmax": (("x",), ("index",), frozenset()),
    "softmax": (("x",), ("y",), frozenset()),
    "label_map": (("x",), ("label",), frozenset({"labels"})),
    "cast": (("x",), ("y",), frozenset({"dtype"})),
    # Fan-in: any number of inputs, joined along the last axis in the order given.
    "concat": ((), ("y",), frozenset()),
    # Paddle Serving's image preprocessing (gateway.config.image_transforms): x -> y.
    **{name: (("x",), ("y",), takes) for name, takes in IMAGE_TRANSFORMS.items()},
}
# What a transform's outputs are, when it is fixed (the others follow their input).
TRANSFORM_DTYPES: dict[tuple[str, str], str] = {
    ("topk", "indices"): "INT64",
    ("argmax", "index"): "INT64",
    ("label_map", "label"): "BYTES",
    **{(name, "y"): dtype for name, dtype in IMAGE_DTYPES.items()},
}

# The processors that run a model file over named tensors (gateway.worker.processors.model): the
# model protocols (KServe V1/V2, gRPC) serve them, they may run in the gateway's threads, have
# model versions and be pipeline steps.
MODEL_PROCESSORS = ("onnx", "sklearn", "xgboost", "lightgbm", "torch", "tensorflow", "pmml")
# Model runtimes whose file is a pickle: loading one runs code, so such a service's model must
# be in one of the operator's gateway.model_dirs.
PICKLE_PROCESSORS = ("sklearn",)
# Model runtimes whose files do not say everything about their input (a dtype, a width):
# a service may declare it (``inputs:``).
DECLARED_INPUTS = ("sklearn", "xgboost", "lightgbm", "torch", "python")
# User code that declares its outputs beside its inputs (gateway.worker.processors.user_tensors).
DECLARED_OUTPUTS = ("python",)
# Of those, the ones whose model takes one input, a feature matrix (TorchScript takes several).
ONE_INPUT = ("sklearn", "xgboost", "lightgbm")
# Model runtimes whose model is a folder, by the file that marks one (others' are a file).
FOLDER_MODELS = {"tensorflow": "saved_model.pb"}
# A model file's runtime by its suffix, as each library names its files (``serve --model`` and
# the model repository pick a service's processor by it; runtime_for).
MODEL_SUFFIXES: dict[str, str] = {
    ".onnx": "onnx",
    ".joblib": "sklearn", ".pkl": "sklearn", ".pickle": "sklearn",
    ".json": "xgboost", ".ubj": "xgboost",
    ".txt": "lightgbm",
    ".pt": "torch",
    ".pmml": "pmml",
}  # fmt: skip
# Model runtimes that run on a device the service names (``device: cuda:0``); others on the CPU.
DEVICE_PROCESSORS = ("torch",)


def runtime_for(name: str, inside: Collection[str] | None = None) -> str | None:
    """The processor that serves a model: a file by its name's suffix, a folder (``inside``:
    the names in it) by the file that marks its kind (a SavedModel's ``saved_model.pb``).
    None when neither says."""
    if inside is not None:
        return next((kind for kind, marker in FOLDER_MODELS.items() if marker in inside), None)
    return MODEL_SUFFIXES.get(PurePath(name).suffix.lower())


# The processors of the services a model step may call (gateway.backends.pipelines.forms speaks each),
# and why the others cannot be one.
STEP_PROCESSORS = (*MODEL_PROCESSORS, "python")
NOT_A_STEP = {
    "queue": "a queue only holds requests for others to take; it runs nothing",
    "pipeline": "a step cannot be a whole pipeline; name the service its model step calls",
}

__all__ = [
    "DECLARED_INPUTS",
    "DECLARED_OUTPUTS",
    "DEVICE_PROCESSORS",
    "DTYPES",
    "FOLDER_MODELS",
    "MODEL_PROCESSORS",
    "MODEL_SUFFIXES",
    "NOT_A_STEP",
    "ONE_INPUT",
    "PICKLE_PROCESSORS",
    "STEP_PROCESSORS",
    "TRANSFORMS",
    "TRANSFORM_DTYPES",
    "runtime_for",
]
