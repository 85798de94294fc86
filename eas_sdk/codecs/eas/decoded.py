"""What a server decodes an EAS predict body into, and the error it answers bad bodies with.

Request formats a server accepts (see docs/processors.md):

* ``tf``    ``PredictRequest`` (root package): inputs by name, ``output_filter`` by name.
* ``torch`` ``pytorch.eas.PredictRequest``: inputs by position (or ``map_inputs`` by name),
  ``output_filter`` by index; the body may be raw-snappy compressed (``TorchRequest(flag=True)``).
* ``blade`` ``blade.Request``: inputs by ``name_in_dl_model``; ``output_info`` selects outputs.
* ``json``  ``{"inputs": {name: nested list | {"shape", "dtype", "data"}}, "outputs": [...]}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
class InputTensor:
    """One decoded input. ``loose``: the wire did not state the dtype (Blade, JSON lists),
    so a safe cast to the model's dtype is allowed."""

    array: np.ndarray
    loose: bool = False


@dataclass
class DecodedRequest:
    kind: str
    named: dict[str, InputTensor] = field(default_factory=dict)
    positional: list[InputTensor | None] = field(default_factory=list)
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


def count_elements(dims: Sequence[int], where: str) -> int:
    n = 1
    for d in dims:
        if d < 0:
            raise InvalidInput(f"{where}: negative dimension in shape {list(dims)}")
        n *= d
        if n > MAX_ELEMENTS:
            raise InvalidInput(f"{where}: shape {list(dims)} has more than {MAX_ELEMENTS} elements")
    return n
