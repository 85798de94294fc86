"""Estimators over one feature matrix: what the sklearn, xgboost and lightgbm runtimes share.

Such a model takes one input, a matrix of ``rows x features``, and answers one array per
method (``predict``, ``predict_proba``) with a row per input row. A runtime says how to load
its file, how many features the model takes when the file says it (``n_features_in_``,
``num_feature()``), and its methods by output name; this module builds the signature from
that:

* the input: named ``input`` with the runtime's dtype and shape ``[-1, features]``, unless
  the service declares it (``inputs: {name: {dtype, shape}}``): the declaration wins for the
  name and the dtype, and its shape must agree with the width the model says;
* the outputs: one per method, each one's dtype and shape learned by running the model once
  on a row of zeros at load (a model that fails on it still loads; its outputs' dtypes are
  then unknown). Text labels come back as BYTES.

Rows are independent in all of these models, so requests are batched along the first axis
when the service asks for it. A run cannot be interrupted: a call past its timeout is
answered 504 while the run ends on its own.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from eas_sdk.codecs import eas
from gateway.core.metadata import DATATYPES
from gateway.worker.processors.base import LoadError, ProcessorError
from gateway.worker.processors.model import ModelProcessor, Signature

log = logging.getLogger("gateway.worker")

# The input's name when the service declares none (the name KServe's and MLServer's
# examples give a feature matrix).
DEFAULT_INPUT = "input"

Method = Callable[[np.ndarray], Any]


def _wire_array(value: Any) -> np.ndarray:
    """A method's answer as the codecs carry it: text labels as Python strings (BYTES)."""
    arr = np.asarray(value)
    return arr.astype(object) if arr.dtype.kind in "US" else arr


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


class EstimatorProcessor(ModelProcessor):
    """A model over one feature matrix; a runtime implements the three abstract methods."""

    # The platform metadata names (KServe V2 ``platform``).
    platform: ClassVar[str]
    # The input's V2 datatype when the service declares none.
    default_dtype: ClassVar[str] = "FP64"
    # What a file for this runtime is, for the message that refuses another.
    expects: ClassVar[str]
    # A prediction's time grows with the rows: short requests may run in the event loop.
    runs_by_size: ClassVar[bool] = True

    @abstractmethod
    def load_model(self, path: str) -> None:
        """Read the model file (blocking). Anything raised becomes a LoadError that names the
        file and ``expects``."""

    @abstractmethod
    def n_features(self) -> int | None:
        """How many features the loaded model takes, when its file says it."""

    @abstractmethod
    def methods(self) -> dict[str, Method]:
        """The loaded model's outputs: name -> a function of the feature matrix."""

    def open(self) -> Signature:
        path = self.service.model
        assert path is not None  # ModelProcessor.load checked it
        try:
            self.load_model(path)
        except LoadError:
            raise
        except Exception as exc:
            raise LoadError(f"cannot load {Path(path).name} as {self.expects}: {first_line(exc)}") from exc
        spec = self._input_spec()
        self._methods = self.methods()
        outputs = tuple(self._probe(spec, name, fn) for name, fn in self._methods.items())
        return Signature((spec,), outputs, self.platform)

    def _input_spec(self) -> eas.TensorSpec:
        decl = self.service.inputs[0] if self.service.inputs else None
        width = self.n_features()
        shape: tuple[int, ...] = (-1, -1 if width is None else width)
        if decl is not None and decl.shape is not None:
            declared = decl.shape
            if width is not None and (len(declared) != 2 or declared[1] not in (-1, width)):
                raise LoadError(
                    f"inputs.{decl.name}.shape: the model takes {width} features (shape [-1, {width}]), "
                    f"the service declares {list(declared)}"
                )
            shape = declared if width is None else (declared[0], width)
        name = decl.name if decl is not None else DEFAULT_INPUT
        dtype = DATATYPES[decl.dtype if decl is not None and decl.dtype else self.default_dtype]
        return eas.TensorSpec(name, dtype, shape)

    def _probe(self, spec: eas.TensorSpec, name: str, fn: Method) -> eas.TensorSpec:
        """An output's dtype and shape, from one run on a row of zeros (empty strings)."""
        dims = spec.shape or ()
        if any(not isinstance(d, int) or d < 0 for d in dims[1:]):
            return eas.TensorSpec(name, None, None)  # the row's width is not known: nothing to run
        row = (1, *(int(d) for d in dims[1:] if isinstance(d, int)))
        x = np.full(row, "", dtype=object) if spec.dtype == np.dtype(object) else np.zeros(row, spec.dtype)
        try:
            y = _wire_array(fn(x))
        except Exception as exc:
            what = first_line(exc)
            log.warning("service %s: %s failed on a row of zeros (%s)", self.service.name, name, what)
            return eas.TensorSpec(name, None, None)
        if y.ndim == 0 or y.shape[0] != 1:
            return eas.TensorSpec(name, y.dtype, None)
        return eas.TensorSpec(name, y.dtype, (-1, *y.shape[1:]))

    def batches_rows(self) -> bool:
        # Rows are independent; process_batch checks each output is split along them.
        return True

    def run(self, wanted: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = feeds[self.inputs[0].name]
        out = []
        for name in wanted:
            try:
                out.append(_wire_array(self._methods[name](x)))
            except Exception as exc:  # the library refuses what our checks let through
                raise ProcessorError(f"model run failed: {first_line(exc)}") from None
        return out


__all__ = ["DEFAULT_INPUT", "EstimatorProcessor", "Method", "first_line"]
