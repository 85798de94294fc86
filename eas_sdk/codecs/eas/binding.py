"""Binding a decoded predict request to a model's signature: inputs by name (TF, Blade,
JSON, Torch map inputs) or by position (Torch), dtype and shape checks, output selection."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from .decoded import DecodedRequest, InputTensor, InvalidInput, type_str

_V = TypeVar("_V")


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


def refusal(spec: TensorSpec, dtype: np.dtype[Any], shape: tuple[int, ...], loose: bool) -> str | None:
    """Why :func:`conform` refuses a tensor of ``dtype`` and ``shape`` for ``spec`` (its
    message), or None when it takes it: a check that needs no array, so a gateway can refuse
    what a model's workers would before sending it."""
    # numpy's dtypes of the builtin types are single objects: most calls match by identity.
    ok_dtype = spec.dtype is None or dtype is spec.dtype or dtype == spec.dtype
    if not ok_dtype and spec.dtype is not None:
        if dtype.kind == "O" and spec.dtype.kind == "O":
            ok_dtype = True
        elif loose and _castable(dtype, spec.dtype):
            dtype, ok_dtype = spec.dtype, True  # conform casts it first
    if spec.shape == () and shape == (1,):
        shape = ()  # one value sent without a shape for a scalar input
    ok_shape = True
    if spec.shape is not None:
        if len(spec.shape) != len(shape):
            ok_shape = False
        else:
            # The lengths are equal (checked above): zip's strict keyword would cost more than the loop.
            for want, got in zip(spec.shape, shape):  # noqa: B905
                if want != got and isinstance(want, int) and want >= 0:
                    ok_shape = False
                    break
    if ok_dtype and ok_shape:
        return None
    return f"input {spec.name!r}: expected {spec.describe()}, got {type_str(dtype, shape)}"


def conform(tensor: InputTensor, spec: TensorSpec) -> np.ndarray:
    """Check ``tensor`` against ``spec``; cast loose tensors. Raises InvalidInput."""
    return _conform(tensor.array, tensor.loose, spec)


def _conform(arr: np.ndarray, loose: bool, spec: TensorSpec) -> np.ndarray:
    message = refusal(spec, arr.dtype, arr.shape, loose)
    if message is not None:
        raise InvalidInput(message)
    if (
        spec.dtype is not None
        and arr.dtype is not spec.dtype
        and arr.dtype != spec.dtype
        and not (arr.dtype.kind == spec.dtype.kind == "O")
    ):
        with np.errstate(all="ignore"):
            arr = arr.astype(spec.dtype)
    if spec.shape == () and arr.shape == (1,):
        arr = arr.reshape(())
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
    return _bind_named(req.named, specs, conform)


def bind_arrays(arrays: Mapping[str, np.ndarray], specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """Arrays by name whose dtype the wire stated (a server's own V2 or gRPC decoder hands them
    over) onto the model's inputs, checked as :func:`bind_inputs` checks named inputs, with no
    decoded request built around them."""
    return _bind_named(arrays, specs, _conform_stated)


def _conform_stated(arr: np.ndarray, spec: TensorSpec) -> np.ndarray:
    return _conform(np.asarray(arr), False, spec)


def _bind_named(
    given: Mapping[str, _V], specs: Sequence[TensorSpec], check: Callable[[_V, TensorSpec], np.ndarray]
) -> dict[str, np.ndarray]:
    """Each model input from the value of its name in ``given``, passed through ``check``:
    a name the model does not take, or an input missing, is refused."""
    # One input, named right (most calls): no name to look for among the model's.
    if not (len(given) == 1 and len(specs) == 1 and specs[0].name in given):
        known = {s.name for s in specs}
        unknown = [n for n in given if n not in known]
        if unknown:
            names = ", ".join(s.name for s in specs)
            raise InvalidInput(f"unknown input {unknown[0]!r}; model inputs: {names}")
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        value = given.get(spec.name)
        if value is None:
            raise InvalidInput(f"missing input {spec.name!r} ({spec.describe()})")
        feeds[spec.name] = check(value, spec)
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
    return output_positions(req.output_names, output_names)


def output_positions(asked: Sequence[str], output_names: Sequence[str]) -> list[int]:
    """Indices of the model outputs named in ``asked``, in that order."""
    out = []
    for n in asked:
        try:
            out.append(output_names.index(n))
        except ValueError:
            raise InvalidInput(f"unknown output {n!r}; model outputs: {', '.join(output_names)}") from None
    return out
